pub mod inspect;
pub mod load;
