pub mod gen_kv;
pub mod inspect;
pub mod kv;
pub mod load;
pub mod sim;
pub mod warm;
