//! CSV traces with configurable columns, in libCacheSim's terms.
//!
//! Each row is one request. [`CsvConfig`] says which 1-based columns hold
//! the timestamp, the object id and the size, whether the first row is a
//! header and which byte separates fields; it parses from libCacheSim's
//! option string (`time-col=2, obj-id-col=5, obj-size-col=4,
//! obj-id-is-num=true, has-header=true`) or the shorter Sluice names
//! (`time-col=1,id-col=2,size-col=3,has-header=true,delimiter=,`).
//!
//! The first row is checked against `has-header`, or, when the options
//! leave it out, judged a header or a request: see `csv/header.rs`.
//!
//! - Without a size column every request has size 1 (libCacheSim's rule);
//!   rows of size 0 are skipped, as libCacheSim skips them.
//! - Ids are unsigned integers, or, with `id-is-num=false`, any bytes,
//!   hashed to 64 bits with FNV-1a: fixed constants, no seed, so the same id
//!   maps to the same number on every run and platform.
//! - Timestamps are unsigned integers; decimal timestamps are truncated.
//! - Fields are trimmed; blank lines are skipped.
//!
//! Rows are read as bytes, so a non-UTF-8 id is hashed like any other and a
//! non-UTF-8 number is reported as a bad field. Every error names the file,
//! the 1-based line, the field and its column.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::SimError;
use crate::trace::{NextAccess, Record, Trace};

mod header;

pub use crate::error::HeaderProblem;
pub use header::HeaderRow;

/// Where a CSV trace keeps its fields. Column numbers are 1-based.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsvConfig {
    /// Timestamp column; `None` gives every record time 0.
    pub time_col: Option<usize>,
    /// Object id column.
    pub id_col: usize,
    /// Size column in bytes; `None` gives every record size 1.
    pub size_col: Option<usize>,
    /// Whether the first row names the columns (and is skipped): as given,
    /// or judged from the row ([`HeaderRow::Detect`], the default).
    pub header: HeaderRow,
    /// Field separator.
    pub delimiter: u8,
    /// Whether ids are unsigned integers; `false` hashes them.
    pub id_is_numeric: bool,
}

impl Default for CsvConfig {
    /// The layout [`write_csv`] produces: `time,id,size`, numeric rows. The
    /// header [`write_csv`] writes is detected, and so is its absence, so
    /// reading what we write, or the same columns without a header, needs
    /// no options.
    fn default() -> CsvConfig {
        CsvConfig {
            time_col: Some(1),
            id_col: 2,
            size_col: Some(3),
            header: HeaderRow::Detect,
            delimiter: b',',
            id_is_numeric: true,
        }
    }
}

const KNOWN_KEYS: &str = "time-col, id-col (obj-id-col), size-col (obj-size-col), \
                          has-header (header), delimiter (delim), id-is-num (obj-id-is-num)";

impl CsvConfig {
    /// Parses an option string of `key=value` pairs separated by commas.
    ///
    /// Like libCacheSim, what the string leaves out is absent: no time or
    /// size column, `,` as delimiter, numeric ids; `id-col` is required,
    /// and the header row is detected unless `has-header` is given. A
    /// column of `0` or `none` removes it. The delimiter may be
    /// written as itself (`delimiter=,` and `delimiter=;` both work), as
    /// `\t`, or by name: `comma`, `tab`, `space`, `semicolon`, `pipe`.
    pub fn parse(spec: &str) -> Result<CsvConfig, SimError> {
        let mut config = CsvConfig {
            time_col: None,
            id_col: 0,
            size_col: None,
            header: HeaderRow::Detect,
            delimiter: b',',
            id_is_numeric: true,
        };
        for (key, value) in split_pairs(spec)? {
            config.apply(spec, &key, &value)?;
        }
        if config.id_col == 0 {
            return Err(spec_error(spec, "id-col is required"));
        }
        config.check_distinct_columns(spec)?;
        Ok(config)
    }

    fn apply(&mut self, spec: &str, key: &str, value: &str) -> Result<(), SimError> {
        match key {
            "time-col" => self.time_col = column(spec, key, value)?,
            "id-col" | "obj-id-col" => {
                self.id_col = column(spec, key, value)?
                    .ok_or_else(|| spec_error(spec, "id-col must be a column number"))?;
            }
            "size-col" | "obj-size-col" => self.size_col = column(spec, key, value)?,
            "has-header" | "header" => {
                self.header = match boolean(spec, key, value)? {
                    true => HeaderRow::Present,
                    false => HeaderRow::Absent,
                }
            }
            "id-is-num" | "obj-id-is-num" => self.id_is_numeric = boolean(spec, key, value)?,
            "delimiter" | "delim" => self.delimiter = delimiter(spec, value)?,
            _ => {
                return Err(spec_error(
                    spec,
                    &format!("unknown key {key:?} (known: {KNOWN_KEYS})"),
                ))
            }
        }
        Ok(())
    }

    fn check_distinct_columns(&self, spec: &str) -> Result<(), SimError> {
        let named = [
            ("time-col", self.time_col),
            ("id-col", Some(self.id_col)),
            ("size-col", self.size_col),
        ];
        for (i, (a, col_a)) in named.iter().enumerate() {
            for (b, col_b) in &named[i + 1..] {
                if let (Some(x), Some(y)) = (col_a, col_b) {
                    if x == y {
                        let message = format!("{a} and {b} are both column {x}");
                        return Err(spec_error(spec, &message));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Splits `a=1, b=2` into pairs; a delimiter written as a bare `,` (the
/// separator of the list itself) is recognised and kept.
fn split_pairs(spec: &str) -> Result<Vec<(String, String)>, SimError> {
    let mut pairs = Vec::new();
    let mut rest = spec;
    while !rest.trim().is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            let message = format!("{:?} is not key=value", rest.trim());
            return Err(spec_error(spec, &message));
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        if key.contains(',') {
            let message = format!("{key:?} is not key=value");
            return Err(spec_error(spec, &message));
        }
        let is_delimiter = key == "delimiter" || key == "delim";
        let (value, tail) = if is_delimiter && after.starts_with(',') {
            (",", &after[1..])
        } else {
            after.split_once(',').unwrap_or((after, ""))
        };
        pairs.push((key, value.trim().to_string()));
        rest = tail;
    }
    Ok(pairs)
}

fn spec_error(spec: &str, message: &str) -> SimError {
    SimError::config(format!("CSV columns {spec:?}"), message)
}

/// A 1-based column number; `0` or `none` means absent.
fn column(spec: &str, key: &str, value: &str) -> Result<Option<usize>, SimError> {
    if value.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match value.parse::<usize>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(spec_error(
            spec,
            &format!("{key}={value:?} is not a 1-based column number"),
        )),
    }
}

fn boolean(spec: &str, key: &str, value: &str) -> Result<bool, SimError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(spec_error(
            spec,
            &format!("{key}={value:?} is not true or false"),
        )),
    }
}

fn delimiter(spec: &str, value: &str) -> Result<u8, SimError> {
    let byte = match value.to_ascii_lowercase().as_str() {
        "comma" => b',',
        "tab" | "\\t" => b'\t',
        "space" => b' ',
        "semicolon" => b';',
        "pipe" => b'|',
        _ if value == "\t" => b'\t',
        _ if value.len() == 1 && value.is_ascii() => value.as_bytes()[0],
        _ => {
            return Err(spec_error(
                spec,
                &format!("delimiter {value:?} is not one ASCII character or a name"),
            ))
        }
    };
    Ok(byte)
}

/// Reads a CSV trace.
pub fn read(path: &Path, config: &CsvConfig) -> Result<Trace, SimError> {
    let file = sluice_engine::open_regular(path, 0).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read_from(
        std::io::BufReader::new(file),
        &path.display().to_string(),
        config,
    )
}

/// Parses CSV text already in memory; `name` names it in errors.
pub fn parse(bytes: &[u8], name: &str, config: &CsvConfig) -> Result<Trace, SimError> {
    read_from(bytes, name, config)
}

fn read_from<R: std::io::Read>(
    input: R,
    name: &str,
    config: &CsvConfig,
) -> Result<Trace, SimError> {
    // The header row is handled here, not by the CSV reader, so that it can
    // be checked or detected (see the module header).
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .delimiter(config.delimiter)
        .flexible(true)
        .from_reader(input);
    let mut row = ::csv::ByteRecord::new();
    let mut records = Vec::new();
    let mut skipped = 0u64;
    let mut first = true;
    while reader
        .read_byte_record(&mut row)
        .map_err(|e| csv_error(e, name))?
    {
        let line = row.position().map_or(0, |p| p.line());
        let fields = RowFields {
            row: &row,
            line,
            name,
        };
        if std::mem::take(&mut first) && fields.is_header(config)? {
            continue;
        }
        let record = fields.record(config)?;
        if record.size == 0 {
            skipped += 1;
            continue;
        }
        records.push(record);
    }
    if skipped > 0 {
        tracing::debug!(trace = name, skipped, "skipped zero-size rows");
    }
    Ok(Trace {
        name: name.to_string(),
        records,
        request_starts: Vec::new(),
        next_access: NextAccess::Missing,
    })
}

fn csv_error(err: ::csv::Error, name: &str) -> SimError {
    let line = err.position().map(|p| p.line());
    match err.into_kind() {
        ::csv::ErrorKind::Io(source) => SimError::Io {
            path: PathBuf::from(name),
            source,
        },
        other => SimError::BadTrace {
            path: PathBuf::from(name),
            message: match line {
                Some(line) => format!("line {line}: {other:?}"),
                None => format!("{other:?}"),
            },
        },
    }
}

/// One row being decoded, with what its errors must name.
struct RowFields<'a> {
    row: &'a ::csv::ByteRecord,
    line: u64,
    name: &'a str,
}

impl RowFields<'_> {
    fn record(&self, config: &CsvConfig) -> Result<Record, SimError> {
        let time = match config.time_col {
            Some(col) => self.time(col)?,
            None => 0,
        };
        let raw_id = self.field("id", config.id_col)?;
        let id = if config.id_is_numeric {
            self.unsigned("id", config.id_col, raw_id)?
        } else {
            fnv1a64(raw_id)
        };
        let size = match config.size_col {
            Some(col) => self.size(col)?,
            None => 1,
        };
        Ok(Record {
            time,
            id,
            size,
            next_access: 0,
        })
    }

    /// The trimmed bytes of 1-based column `col`. Trimming here rather than
    /// in the CSV reader (`Trim::All`) keeps 10 M rows near a second.
    fn field(&self, field: &str, col: usize) -> Result<&[u8], SimError> {
        let cell = col.checked_sub(1).and_then(|i| self.row.get(i));
        cell.map(<[u8]>::trim_ascii).ok_or_else(|| {
            let count = self.row.len();
            self.error(
                field,
                col,
                format!("missing: the row has only {count} fields"),
            )
        })
    }

    fn unsigned(&self, field: &str, col: usize, raw: &[u8]) -> Result<u64, SimError> {
        if let Some(v) = ascii_digits(raw) {
            return Ok(v);
        }
        let text = self.text(field, col, raw)?;
        text.parse::<u64>()
            .map_err(|_| self.error(field, col, format!("{text:?} is not an unsigned integer")))
    }

    /// An object size: an unsigned integer no larger than
    /// [`MAX_OBJECT_BYTES`], so byte counters over any trace stay exact.
    fn size(&self, col: usize) -> Result<u64, SimError> {
        let size = self.unsigned("size", col, self.field("size", col)?)?;
        if size > MAX_OBJECT_BYTES {
            return Err(self.error(
                "size",
                col,
                format!("{size} bytes: larger than {MAX_OBJECT_BYTES} (1 TiB), the largest object a trace may hold"),
            ));
        }
        Ok(size)
    }

    /// An unsigned integer, or a decimal truncated to one.
    fn time(&self, col: usize) -> Result<u64, SimError> {
        let raw = self.field("time", col)?;
        if let Some(v) = ascii_digits(raw) {
            return Ok(v);
        }
        let text = self.text("time", col, raw)?;
        if let Ok(v) = text.parse::<u64>() {
            return Ok(v);
        }
        match text.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 && v < u64::MAX as f64 => Ok(v as u64),
            _ => Err(self.error(
                "time",
                col,
                format!("{text:?} is not a non-negative number"),
            )),
        }
    }

    fn text<'b>(&self, field: &str, col: usize, raw: &'b [u8]) -> Result<&'b str, SimError> {
        std::str::from_utf8(raw).map_err(|_| {
            let shown = String::from_utf8_lossy(raw);
            self.error(field, col, format!("{shown:?} is not valid UTF-8"))
        })
    }

    fn error(&self, field: &str, col: usize, message: String) -> SimError {
        SimError::BadField {
            path: PathBuf::from(self.name),
            line: self.line,
            field: format!("{field} (col {col})"),
            message,
        }
    }
}

/// The largest object size a CSV trace may give: 1 TiB, far above any
/// cached object, and small enough that byte counters over 16 million of
/// them stay inside `u64` (sizes near 2^64 wrapped them before).
pub const MAX_OBJECT_BYTES: u64 = 1 << 40;

/// The common case of an unsigned integer field: plain ASCII digits that
/// fit `u64`. Anything else (`+5`, overflow, junk) goes to the slow path,
/// which parses or reports it.
fn ascii_digits(raw: &[u8]) -> Option<u64> {
    if raw.is_empty() {
        return None;
    }
    raw.iter().try_fold(0u64, |acc, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d < 10)?;
        acc.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// 64-bit FNV-1a: a fixed, seedless hash, identical on every platform.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// Writes `trace` in the [`CsvConfig::default`] layout: a `time,id,size`
/// header, then one row per record.
pub fn write_csv(trace: &Trace, path: &Path) -> Result<(), SimError> {
    crate::atomic::write_file(path, |out| write_csv_to(trace, out))
}

/// [`write_csv`] into any writer.
pub fn write_csv_to<W: Write + ?Sized>(trace: &Trace, out: &mut W) -> std::io::Result<()> {
    writeln!(out, "time,id,size")?;
    for r in &trace.records {
        writeln!(out, "{},{},{}", r.time, r.id, r.size)?;
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(super) fn cfg(spec: &str) -> CsvConfig {
        CsvConfig::parse(spec).unwrap()
    }

    pub(super) fn ids(trace: &Trace) -> Vec<u64> {
        trace.records.iter().map(|r| r.id).collect()
    }

    pub(super) fn err(text: &str, spec: &str) -> String {
        parse(text.as_bytes(), "trace.csv", &cfg(spec))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn parses_libcachesim_option_strings() {
        let c =
            cfg("time-col=2, obj-id-col=5, obj-size-col=4, obj-id-is-num=true, has-header=true");
        assert_eq!(c.time_col, Some(2));
        assert_eq!(c.id_col, 5);
        assert_eq!(c.size_col, Some(4));
        assert!(c.header == HeaderRow::Present && c.id_is_numeric);
    }

    #[test]
    fn unspecified_options_are_absent_like_libcachesim() {
        let c = cfg("id-col=2");
        assert_eq!(
            (c.time_col, c.size_col, c.header),
            (None, None, HeaderRow::Detect)
        );
        assert_eq!(c.delimiter, b',');
    }

    #[test]
    fn delimiter_can_be_a_bare_comma_or_a_name() {
        assert_eq!(cfg("id-col=1,delimiter=,").delimiter, b',');
        assert_eq!(cfg("delimiter=,,id-col=1").delimiter, b',');
        assert_eq!(cfg("id-col=1,delimiter=;").delimiter, b';');
        assert_eq!(cfg("id-col=1,delimiter=tab").delimiter, b'\t');
        assert_eq!(cfg("id-col=1,delimiter=\\t").delimiter, b'\t');
    }

    #[test]
    fn option_string_errors_are_clear() {
        let cases = [
            ("size-col=3", "id-col is required"),
            ("id-col=x", "id-col=\"x\" is not a 1-based column number"),
            ("id-col=1,colour=red", "unknown key \"colour\""),
            ("id-col=1,has-header=maybe", "is not true or false"),
            ("id-col=1,delimiter=ab", "delimiter \"ab\""),
            (
                "id-col=2,size-col=2",
                "id-col and size-col are both column 2",
            ),
            ("id-col=1,has-header", "is not key=value"),
        ];
        for (spec, want) in cases {
            let e = CsvConfig::parse(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec}: {e}");
        }
    }

    #[test]
    fn reads_selected_columns_and_skips_the_header() {
        let text = "a,b,c\n10,7,100\n11,8,200\n";
        let t = parse(
            text.as_bytes(),
            "t",
            &cfg("time-col=1,id-col=2,size-col=3,has-header=true"),
        )
        .unwrap();
        let want = [(10, 7, 100), (11, 8, 200)];
        let got: Vec<_> = t.records.iter().map(|r| (r.time, r.id, r.size)).collect();
        assert_eq!(got, want);
        assert!(!t.has_next_access());
    }

    #[test]
    fn missing_size_column_means_size_one() {
        let t = parse(b"5\n6\n", "t", &cfg("id-col=1")).unwrap();
        assert!(t.records.iter().all(|r| r.size == 1));
    }

    #[test]
    fn string_ids_hash_stably() {
        let t = parse(
            b"alpha\nbeta\nalpha\n",
            "t",
            &cfg("id-col=1,id-is-num=false,has-header=false"),
        )
        .unwrap();
        assert_eq!(
            ids(&t),
            [fnv1a64(b"alpha"), fnv1a64(b"beta"), fnv1a64(b"alpha")]
        );
        // Pinned values: ids must hash the same in every release. "a" is
        // the published FNV-1a 64 test vector.
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"alpha"), 0x8ac6_25bb_85ed_202b);
        assert_ne!(t.records[0].id, t.records[1].id);
    }

    #[test]
    fn zero_size_rows_and_blank_lines_are_skipped() {
        let t = parse(b"1,0\n\n2,5\n", "t", &cfg("id-col=1,size-col=2")).unwrap();
        assert_eq!(ids(&t), [2]);
    }

    #[test]
    fn sizes_past_a_tebibyte_are_refused_naming_line_and_field() {
        let config = CsvConfig {
            size_col: Some(2),
            id_col: 1,
            header: HeaderRow::Absent,
            ..CsvConfig::default()
        };
        let ok = format!("1,{}\n", MAX_OBJECT_BYTES);
        assert_eq!(
            parse(ok.as_bytes(), "t.csv", &config).unwrap().records[0].size,
            MAX_OBJECT_BYTES
        );
        // 2^64 - 1 used to be taken, and wrapped every byte counter of the study.
        let huge = format!("1,10\n2,{}\n", u64::MAX);
        match parse(huge.as_bytes(), "t.csv", &config) {
            Err(SimError::BadField {
                line,
                field,
                message,
                ..
            }) => {
                assert_eq!(line, 2);
                assert!(field.starts_with("size"), "{field}");
                assert!(message.contains("1 TiB"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fields_are_trimmed_and_overflow_is_an_error() {
        // The largest size taken (2^64 - 1 was taken before, and wrapped the byte counters).
        let t = parse(b" 7 , 1099511627776 \n", "t", &cfg("id-col=1,size-col=2")).unwrap();
        assert_eq!((t.records[0].id, t.records[0].size), (7, MAX_OBJECT_BYTES));
        let e = err("1,18446744073709551616\n", "id-col=1,size-col=2");
        assert!(
            e.contains("\"18446744073709551616\" is not an unsigned integer"),
            "{e}"
        );
        assert_eq!(ascii_digits(b"+5"), None);
        assert_eq!(
            parse(b"+5\n", "t", &cfg("id-col=1")).unwrap().records[0].id,
            5
        );
    }

    #[test]
    fn decimal_timestamps_are_truncated() {
        let t = parse(b"12.75,1\n", "t", &cfg("time-col=1,id-col=2")).unwrap();
        assert_eq!(t.records[0].time, 12);
    }

    #[test]
    fn bad_number_names_line_field_and_column() {
        let text = "time,id,size\n1,2,3\n1,2,12x\n";
        let e = err(text, "id-col=2,size-col=3,has-header=true");
        assert_eq!(
            e,
            "trace.csv:3: field size (col 3): \"12x\" is not an unsigned integer"
        );
    }

    #[test]
    fn negative_and_bad_ids_and_times_are_errors() {
        assert!(err("-1\n", "id-col=1").contains("field id (col 1): \"-1\""));
        assert!(err("x,1\n", "time-col=1,id-col=2").contains("field time (col 1)"));
    }

    #[test]
    fn missing_column_names_the_field() {
        let e = err("1,2\n1\n", "id-col=1,size-col=2");
        assert_eq!(
            e,
            "trace.csv:2: field size (col 2): missing: the row has only 1 fields"
        );
    }

    #[test]
    fn invalid_utf8_in_a_number_is_a_field_error() {
        let e = parse(b"1,\xff\xfe\n", "trace.csv", &cfg("id-col=1,size-col=2"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("trace.csv:1: field size (col 2):"), "{e}");
        assert!(e.contains("not valid UTF-8"), "{e}");
    }

    #[test]
    fn invalid_utf8_string_ids_are_hashed() {
        let t = parse(
            b"\xff\n",
            "t",
            &cfg("id-col=1,id-is-num=false,has-header=no"),
        )
        .unwrap();
        assert_eq!(ids(&t), [fnv1a64(b"\xff")]);
    }

    #[test]
    fn empty_file_is_an_empty_trace() {
        assert!(parse(b"", "t", &CsvConfig::default()).unwrap().is_empty());
        assert!(parse(b"time,id,size\n", "t", &CsvConfig::default())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn write_then_read_round_trips_with_the_default_layout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        let records = vec![
            Record {
                time: 3,
                id: u64::MAX,
                size: 1 << 40,
                next_access: 0,
            },
            Record {
                time: 4,
                id: 0,
                size: 7,
                next_access: 0,
            },
        ];
        let trace = Trace {
            name: "t".into(),
            records,
            ..Trace::default()
        };
        write_csv(&trace, &path).unwrap();
        let back = read(&path, &CsvConfig::default()).unwrap();
        assert_eq!(back.records, trace.records);
        assert_eq!(back.name, path.display().to_string());
    }
}
