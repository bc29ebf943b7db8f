//! GGUF metadata values.

/// The type tag of a metadata value, as stored in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The tag as stored in the file (the inverse of [`ValueType::from_id`]).
    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Bytes one value of this type occupies, for fixed-size types.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

/// One decoded metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(Vec<MetadataValue>),
}

impl MetadataValue {
    /// The type tag this value is stored with.
    pub fn value_type(&self) -> ValueType {
        use MetadataValue as V;
        match self {
            V::U8(_) => ValueType::U8,
            V::I8(_) => ValueType::I8,
            V::U16(_) => ValueType::U16,
            V::I16(_) => ValueType::I16,
            V::U32(_) => ValueType::U32,
            V::I32(_) => ValueType::I32,
            V::F32(_) => ValueType::F32,
            V::Bool(_) => ValueType::Bool,
            V::String(_) => ValueType::String,
            V::U64(_) => ValueType::U64,
            V::I64(_) => ValueType::I64,
            V::F64(_) => ValueType::F64,
            V::Array(_) => ValueType::Array,
        }
    }

    /// The value as an unsigned integer, if it is an integer that fits.
    pub fn as_u64(&self) -> Option<u64> {
        use MetadataValue::*;
        match *self {
            U8(v) => Some(v.into()),
            U16(v) => Some(v.into()),
            U32(v) => Some(v.into()),
            U64(v) => Some(v),
            I8(v) => u64::try_from(v).ok(),
            I16(v) => u64::try_from(v).ok(),
            I32(v) => u64::try_from(v).ok(),
            I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        use MetadataValue::*;
        match *self {
            U64(v) => i64::try_from(v).ok(),
            I8(v) => Some(v.into()),
            I16(v) => Some(v.into()),
            I32(v) => Some(v.into()),
            I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float (any numeric type).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            MetadataValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short human-readable rendering (arrays summarised by length).
    pub fn summary(&self) -> String {
        use MetadataValue::*;
        match self {
            String(s) if s.chars().count() > 80 => {
                format!("{:?}...", s.chars().take(77).collect::<std::string::String>())
            }
            String(s) => format!("{s:?}"),
            Array(a) => format!("[{} values]", a.len()),
            U8(v) => v.to_string(),
            I8(v) => v.to_string(),
            U16(v) => v.to_string(),
            I16(v) => v.to_string(),
            U32(v) => v.to_string(),
            I32(v) => v.to_string(),
            F32(v) => v.to_string(),
            Bool(v) => v.to_string(),
            U64(v) => v.to_string(),
            I64(v) => v.to_string(),
            F64(v) => v.to_string(),
        }
    }
}
