//! Laying out lf-info's text: columns, and long sentences wrapped under their column.

/// The width text is wrapped to: `$COLUMNS` where the shell exports it, else 120.
pub fn width() -> usize {
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|&c: &usize| c >= 60).unwrap_or(120)
}

/// `text` wrapped at spaces to lines of at most `width - indent` characters (a word longer
/// than that gets a line of its own), each line after the first indented by `indent` spaces.
/// Ends without a newline.
pub fn wrap(text: &str, indent: usize, width: usize) -> String {
    let room = width.saturating_sub(indent).max(20);
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > room {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines.join(&format!("\n{}", " ".repeat(indent)))
}

/// `cells` padded to `widths` and joined by two spaces; the last cell is wrapped under its
/// own column. Ends with a newline.
pub fn row(cells: &[&str], widths: &[usize], width: usize) -> String {
    let mut out = String::from("  ");
    let mut at = 2;
    for (i, cell) in cells.iter().enumerate() {
        if i + 1 == cells.len() {
            out.push_str(&wrap(cell, at, width));
        } else {
            let w = widths.get(i).copied().unwrap_or(0);
            out.push_str(&format!("{cell:<w$}  "));
            at += w.max(cell.chars().count()) + 2;
        }
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// A line that continues the last column of a table whose other columns take `indent`.
pub fn continuation(text: &str, indent: usize, width: usize) -> String {
    format!("{}{}\n", " ".repeat(indent), wrap(text, indent, width))
}

/// Bytes as `512 B`, `64 KiB`, `2 MiB`, `1.5 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_keeps_words_whole_and_indents() {
        assert_eq!(wrap("aaa bbb ccc", 2, 29), "aaa bbb ccc");
        let wrapped = wrap(&"word ".repeat(10), 4, 24);
        assert!(wrapped.lines().skip(1).all(|l| l.starts_with("    ") && l.len() <= 24), "{wrapped}");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(2 << 20), "2 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
    }
}
