//! Output for people (aligned tables) and for scripts (`--json`: one JSON document, or JSON
//! lines for a stream; `--csv`: RFC 4180, a header line first).

use serde_json::Value;
use std::io::{IsTerminal, Write};

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns, for people.
    Table,
    /// One JSON document (JSON lines for streams).
    Json,
    /// RFC 4180 CSV with a header line.
    Csv,
}

/// A result: its rows for a table or CSV, and its JSON document.
pub struct Output {
    /// The column names.
    pub headers: Vec<&'static str>,
    /// The rows, each as long as `headers`.
    pub rows: Vec<Vec<String>>,
    /// What `--json` prints.
    pub json: Value,
}

impl Output {
    /// Rows and their JSON.
    pub fn new(headers: Vec<&'static str>, rows: Vec<Vec<String>>, json: Value) -> Output {
        Output {
            headers,
            rows,
            json,
        }
    }

    /// Prints it to stdout in `format`.
    pub fn print(&self, format: Format) {
        let mut out = std::io::stdout().lock();
        let text = match format {
            Format::Json => format!("{}\n", serde_json::to_string_pretty(&self.json).unwrap()),
            Format::Csv => {
                let mut text = csv_line(self.headers.iter().copied());
                for row in &self.rows {
                    text += &csv_line(row.iter().map(String::as_str));
                }
                text
            }
            Format::Table => table(&self.headers, &self.rows),
        };
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
}

/// One CSV record (RFC 4180): a field with a comma, a quote or a line break is quoted, its
/// quotes doubled; lines end with CRLF.
pub fn csv_line<'a>(fields: impl Iterator<Item = &'a str>) -> String {
    let fields: Vec<String> = fields
        .map(|field| {
            if field.contains([',', '"', '\r', '\n']) {
                format!("\"{}\"", field.replace('"', "\"\""))
            } else {
                field.to_string()
            }
        })
        .collect();
    format!("{}\r\n", fields.join(","))
}

/// Columns padded to their widest cell; a cell's line breaks shown as `\n`, so a row stays one
/// line.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cell = |text: &str| text.replace('\r', "\\r").replace('\n', "\\n");
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| cell(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            text += cell;
            if i < last {
                text += &" ".repeat(width - cell.chars().count() + 2);
            }
        }
        text.trim_end().to_string() + "\n"
    };
    let mut text = line(headers.to_vec());
    for row in &rows {
        text += &line(row.iter().map(String::as_str).collect());
    }
    text
}

/// A stream's output: one line per item as it comes (a JSON line, a CSV record, or a tab
/// separated line for people), the header first.
pub struct Lines {
    format: Format,
    started: bool,
    headers: Vec<&'static str>,
}

impl Lines {
    /// A stream with these columns.
    pub fn new(format: Format, headers: Vec<&'static str>) -> Lines {
        Lines {
            format,
            started: false,
            headers,
        }
    }

    /// Prints one item at once; an error when stdout is closed (`qe tail | head -3`), so a
    /// stream can stop when no one reads it.
    pub fn item(&mut self, row: &[String], json: &Value) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        let mut text = String::new();
        if !self.started && self.format != Format::Json {
            text += &match self.format {
                Format::Csv => csv_line(self.headers.iter().copied()),
                _ => format!("{}\n", self.headers.join("\t")),
            };
        }
        self.started = true;
        text += &match self.format {
            Format::Json => format!("{json}\n"),
            Format::Csv => csv_line(row.iter().map(String::as_str)),
            Format::Table => {
                let cells: Vec<String> = row
                    .iter()
                    .map(|c| c.replace('\n', "\\n").replace('\t', "\\t"))
                    .collect();
                format!("{}\n", cells.join("\t"))
            }
        };
        out.write_all(text.as_bytes())?;
        out.flush()
    }
}

/// A progress indicator on stderr for a long operation, shown only when stderr is a terminal
/// (scripts see nothing).
pub fn progress(message: &str, total: Option<u64>) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match total {
        Some(total) => indicatif::ProgressBar::new(total).with_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}")
                .expect("a template")
                .progress_chars("=> "),
        ),
        None => indicatif::ProgressBar::new_spinner().with_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} {pos}").expect("a template"),
        ),
    };
    bar.set_message(message.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_what_it_must() {
        let line = csv_line(["a", "b,c", "say \"hi\"", "two\nlines"].into_iter());
        assert_eq!(line, "a,\"b,c\",\"say \"\"hi\"\"\",\"two\nlines\"\r\n");
    }

    #[test]
    fn tables_align() {
        let text = table(
            &["ID", "STATUS"],
            &[
                vec!["abc".into(), "running".into()],
                vec!["abcdef".into(), "x".into()],
            ],
        );
        assert_eq!(text, "ID      STATUS\nabc     running\nabcdef  x\n");
    }
}
