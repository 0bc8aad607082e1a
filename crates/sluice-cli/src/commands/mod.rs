pub mod gen_kv;
pub mod inspect;
pub mod kv;
pub mod kv_serve;
pub mod load;
pub mod signals;
pub mod sim;
pub mod warm;
