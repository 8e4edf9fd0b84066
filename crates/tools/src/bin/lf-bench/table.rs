//! OSU-style text output: comment lines start with `# ` (the configuration, a table's title
//! and its column names), data rows do not, and every column lines up under its name, so that
//! a table reads at a glance and `grep -v '^#'` gives plain columns.

/// A table: column names, then rows of cells, printed with each column as wide as its widest
/// cell. The first column and those marked text are left-aligned, numbers right-aligned.
pub struct Table {
    names: Vec<String>,
    text: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns named `names`; a name starting with `<` is a text column (the `<` is dropped).
    pub fn new(names: &[&str]) -> Table {
        Table {
            names: names.iter().map(|n| n.trim_start_matches('<').to_owned()).collect(),
            text: names.iter().enumerate().map(|(i, n)| i == 0 || n.starts_with('<')).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.names.len());
        self.rows.push(cells);
    }

    /// The header (`# ` and the names) and the rows; trailing blanks trimmed.
    pub fn lines(&self) -> Vec<String> {
        let mut widths: Vec<usize> = self.names.iter().map(|n| n.chars().count()).collect();
        widths[0] += 2;
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let pad = widths[i].saturating_sub(cell.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                if self.text[i] {
                    out.push_str(cell);
                    out.extend(std::iter::repeat(' ').take(pad));
                } else {
                    out.extend(std::iter::repeat(' ').take(pad));
                    out.push_str(cell);
                }
            }
            out.trim_end().to_owned()
        };
        let mut header = self.names.clone();
        header[0] = format!("# {}", header[0]);
        let mut lines = vec![line(&header)];
        lines.extend(self.rows.iter().map(|r| line(r)));
        lines
    }

    pub fn print(&self) {
        for l in self.lines() {
            println!("{l}");
        }
    }
}

/// A comment line: `# ` and the text (an empty text gives `#`).
pub fn comment(text: &str) {
    for line in text.lines() {
        println!("{}", format!("# {line}").trim_end());
    }
    if text.is_empty() {
        println!("#");
    }
}

/// ns as µs with three decimals (`-` for none or NaN).
pub fn us(ns: Option<f64>) -> String {
    match ns {
        Some(v) if v.is_finite() => format!("{:.3}", v / 1e3),
        _ => "-".to_owned(),
    }
}

/// Bytes per second as MB/s (10^6 bytes per second), two decimals.
pub fn mb_s(bytes_per_s: Option<f64>) -> String {
    match bytes_per_s {
        Some(v) if v.is_finite() => format!("{:.2}", v / 1e6),
        _ => "-".to_owned(),
    }
}

/// A ratio with two decimals.
pub fn ratio(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.2}"),
        _ => "-".to_owned(),
    }
}

/// The bandwidth of a ping-pong's half round trip: `size` bytes in `ns`.
pub fn pingpong_bytes_per_s(size: usize, ns: f64) -> f64 {
    size as f64 * 1e9 / ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_under_their_names() {
        let mut t = Table::new(&["Size", "<Sender", "Latency (us)"]);
        t.row(vec!["8".into(), "C API copy".into(), "0.140".into()]);
        t.row(vec!["1048576".into(), "iceoryx2".into(), "12.500".into()]);
        let lines = t.lines();
        assert_eq!(lines[0], "# Size   Sender      Latency (us)");
        assert_eq!(lines[1], "8        C API copy         0.140");
        assert_eq!(lines[2], "1048576  iceoryx2          12.500");
    }

    #[test]
    fn formats() {
        assert_eq!(us(Some(140.0)), "0.140");
        assert_eq!(us(Some(f64::NAN)), "-");
        assert_eq!(mb_s(Some(2.5e9)), "2500.00");
        assert_eq!(ratio(None), "-");
        assert_eq!(pingpong_bytes_per_s(1000, 1000.0), 1e9);
    }
}
