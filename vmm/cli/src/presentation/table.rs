//! Aligned text tables.

use std::fmt::Write as _;

/// Renders an aligned text table: first column left-aligned, the rest right-aligned.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cols = headers.len();
    let mut width: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        let mut l = String::new();
        for (i, w) in width.iter().enumerate() {
            let c = cells.get(i).map(String::as_str).unwrap_or("");
            if i == 0 {
                let _ = write!(l, "{c:<w$}");
            } else {
                let _ = write!(l, "  {c:>w$}");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    let head: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    line(&mut out, &head);
    let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
    line(&mut out, &rule);
    for row in rows {
        line(&mut out, row);
    }
    out
}
