//! Configuration errors. Policies themselves cannot fail at run time.

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error("unknown policy {name:?}; known policies: {known}")]
    UnknownPolicy { name: String, known: String },
    #[error("policy {policy}: {field} = {value} is out of range ({expected})")]
    BadParameter {
        policy: &'static str,
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("policy {policy}: unknown parameter {field:?}; it takes {known}")]
    UnknownParameter {
        policy: &'static str,
        field: String,
        known: &'static str,
    },
    #[error("capacity must be at least 1, got 0")]
    ZeroCapacity,
}
