//! The first row of a CSV trace: a header, or the first request.
//!
//! `has-header=false` reads it as a request. Otherwise it is judged by the
//! numeric columns being read (time, size, and the id when ids are
//! numbers), not by counting digits and letters as libCacheSim's detection
//! does:
//!
//! - a number in each: a request. Under `has-header=true` that is an error
//!   ([`HeaderProblem::LooksLikeData`]), not a request silently dropped: a
//!   header-less file read with the default layout lost its first row so;
//! - a word (a cell with a letter) in each: a header, skipped;
//! - anything else (`1,2,12x`, or `-1` alone): a request with a bad field,
//!   read so that the error names it, unless `has-header=true` says it is a
//!   header;
//! - no numeric column (string ids alone): the row cannot tell. With
//!   `has-header` left out that is an error ([`HeaderProblem::Undecidable`])
//!   rather than a guess that might drop a request or read a header as one.
//!
//! The decision is logged at info level.

use std::path::PathBuf;

use super::{CsvConfig, RowFields};
use crate::error::{HeaderProblem, SimError};

/// Whether a CSV trace's first row is a header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeaderRow {
    /// Decide from the first row (see the module header): the default, so
    /// a file with or without a header reads without options.
    #[default]
    Detect,
    /// `has-header=true`: skip the first row (an error if it looks like data).
    Present,
    /// `has-header=false`: the first row is a request.
    Absent,
}

impl RowFields<'_> {
    /// Whether this row, the file's first, is a header: as the options say,
    /// or detected; an error where it looks like data but the options say
    /// header, or where detection cannot tell.
    pub(super) fn is_header(&self, config: &CsvConfig) -> Result<bool, SimError> {
        if config.header == HeaderRow::Absent {
            return Ok(false);
        }
        let looks = self.first_row_kind(config);
        let problem = match (config.header, looks) {
            (HeaderRow::Absent, _) => return Ok(false),
            (HeaderRow::Present, FirstRow::Data) => HeaderProblem::LooksLikeData,
            (HeaderRow::Present, _) => return Ok(true),
            (HeaderRow::Detect, FirstRow::Names) => {
                tracing::info!(trace = self.name, "first row is a header (not numeric)");
                return Ok(true);
            }
            (HeaderRow::Detect, FirstRow::Data | FirstRow::Mixed) => {
                tracing::info!(trace = self.name, "no header: the first row is a request");
                return Ok(false);
            }
            (HeaderRow::Detect, FirstRow::Undecidable) => HeaderProblem::Undecidable,
        };
        let shown = self
            .row
            .iter()
            .map(String::from_utf8_lossy)
            .collect::<Vec<_>>()
            .join(&char::from(config.delimiter).to_string());
        Err(SimError::CsvHeader {
            path: PathBuf::from(self.name),
            line: self.line,
            row: shown.chars().take(80).collect(),
            problem,
        })
    }

    /// What the numeric columns being read make of this row: a number in
    /// each, a name (a word with a letter: `-1` or a blank is neither) in
    /// each, something else, or no numeric column to look at.
    fn first_row_kind(&self, config: &CsvConfig) -> FirstRow {
        let cell = |field, col, is_number: bool| {
            if is_number {
                return Cell::Number;
            }
            match self.field(field, col) {
                Ok(raw) if raw.iter().any(u8::is_ascii_alphabetic) => Cell::Name,
                _ => Cell::Other,
            }
        };
        let unsigned = |field, col| {
            let ok = self
                .field(field, col)
                .and_then(|raw| self.unsigned(field, col, raw));
            cell(field, col, ok.is_ok())
        };
        let cells = [
            config
                .time_col
                .map(|col| cell("time", col, self.time(col).is_ok())),
            config.size_col.map(|col| unsigned("size", col)),
            config.id_is_numeric.then(|| unsigned("id", config.id_col)),
        ];
        let mut cells = cells.into_iter().flatten().peekable();
        let Some(&first) = cells.peek() else {
            return FirstRow::Undecidable;
        };
        match first {
            Cell::Number if cells.all(|c| c == Cell::Number) => FirstRow::Data,
            Cell::Name if cells.all(|c| c == Cell::Name) => FirstRow::Names,
            _ => FirstRow::Mixed,
        }
    }
}

/// What a first row looks like, judged by the numeric columns being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FirstRow {
    /// Every numeric column holds a number.
    Data,
    /// Every numeric column holds a word: column names.
    Names,
    /// Anything else: a request with a bad field (read, so it is named).
    Mixed,
    /// No numeric column is read (string ids alone).
    Undecidable,
}

/// One numeric column's cell in a first row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    Number,
    /// Not a number, and holds a letter.
    Name,
    Other,
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cfg, err, ids};
    use super::super::{fnv1a64, parse};
    use super::*;

    #[test]
    fn a_headerless_csv_keeps_its_first_row_under_the_default_layout() {
        // The default layout has a header; a file without one lost its first
        // request silently.
        let t = parse(b"1,7,100\n2,8,200\n", "t.csv", &CsvConfig::default()).unwrap();
        let got: Vec<_> = t.records.iter().map(|r| (r.time, r.id, r.size)).collect();
        assert_eq!(got, [(1, 7, 100), (2, 8, 200)]);
        let t = parse(b"time,id,size\n1,7,100\n", "t.csv", &CsvConfig::default()).unwrap();
        assert_eq!(ids(&t), [7]);
    }

    #[test]
    fn a_numeric_first_row_under_has_header_true_is_an_error_naming_it() {
        let e = parse(
            b"1,7,100\n2,8,200\n",
            "t.csv",
            &cfg("id-col=2,has-header=true"),
        );
        match e {
            Err(SimError::CsvHeader {
                line, row, problem, ..
            }) => {
                assert_eq!((line, row.as_str()), (1, "1,7,100"));
                assert_eq!(problem, HeaderProblem::LooksLikeData);
            }
            other => panic!("{other:?}"),
        }
        let e = err(
            "1,7,100\n",
            "time-col=1,id-col=2,size-col=3,has-header=true",
        );
        assert!(
            e.starts_with("trace.csv:1: first row \"1,7,100\" looks like a request"),
            "{e}"
        );
        assert!(e.contains("pass has-header=false"), "{e}");
        // A header whose numeric columns hold something else is trusted.
        let t = parse(
            b"ts,7,size\n1,8,5\n",
            "t",
            &cfg("time-col=1,id-col=2,size-col=3,header=1"),
        );
        assert_eq!(ids(&t.unwrap()), [8]);
    }

    #[test]
    fn the_header_row_is_detected_when_has_header_is_left_out() {
        let spec = "id-col=1,size-col=2,id-is-num=false";
        let with = parse(b"key,bytes\nalpha,5\n", "t", &cfg(spec)).unwrap();
        assert_eq!(ids(&with), [fnv1a64(b"alpha")]);
        let without = parse(b"alpha,5\nbeta,6\n", "t", &cfg(spec)).unwrap();
        assert_eq!(without.len(), 2);
        // has-header=false reads a header as a request, and names its field.
        let e = err("key,bytes\nalpha,5\n", &format!("{spec},has-header=false"));
        assert!(
            e.starts_with("trace.csv:1: field size (col 2): \"bytes\""),
            "{e}"
        );
    }

    #[test]
    fn a_bad_first_row_is_read_and_named_not_taken_for_a_header() {
        // Neither all numbers nor all words: a request with a bad field.
        let e = err("1,2,12x\n3,4,5\n", "time-col=1,id-col=2,size-col=3");
        assert_eq!(
            e,
            "trace.csv:1: field size (col 3): \"12x\" is not an unsigned integer"
        );
        let e = parse(b"1,2,12x\n", "t.csv", &CsvConfig::default()).unwrap_err();
        assert!(matches!(e, SimError::BadField { line: 1, .. }), "{e}");
        // A lone bad number has no letter: not a column name.
        assert!(err("-1\n5\n", "id-col=1").contains("field id (col 1): \"-1\""));
    }

    #[test]
    fn string_ids_alone_cannot_tell_a_header_and_say_so() {
        let e = parse(b"alpha\nbeta\n", "t.csv", &cfg("id-col=1,id-is-num=false"));
        let Err(e @ SimError::CsvHeader { .. }) = e else {
            panic!("{e:?}");
        };
        let text = e.to_string();
        assert!(
            text.starts_with("t.csv:1: first row \"alpha\" cannot tell"),
            "{text}"
        );
        assert!(
            text.contains("has-header=true or has-header=false"),
            "{text}"
        );
        let spec = "id-col=1,id-is-num=false,has-header=true";
        assert_eq!(parse(b"key\nalpha\n", "t", &cfg(spec)).unwrap().len(), 1);
    }
}
