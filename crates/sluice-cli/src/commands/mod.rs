pub mod ckpt;
pub mod gen_kv;
pub mod inspect;
pub mod kv;
pub mod kv_serve;
pub mod load;
pub mod mount;
pub mod signals;
pub mod sim;
pub mod warm;

/// `bytes` for people: "812 B", "3.4 MiB", "1.2 GiB".
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
