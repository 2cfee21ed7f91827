//! Text from outside the operator (message bodies, tenant and handler
//! names, handler errors, database and broker error texts) as logs show
//! it: on one line, with no terminal control sequences.
//!
//! A log line is one record: a raw newline in a logged value starts a line
//! that reads as a record of its own (a forged `ERROR`), and an ESC starts
//! a terminal control sequence. tracing-subscriber's fmt layer (0.3.20 and
//! later) escapes ESC, BEL, BS, FF, DEL and C1 controls in the message and
//! in errors recorded as errors, but not in `%` fields and never newlines;
//! herald does not rely on it, and logs every such text through
//! [`escaped`].

use std::fmt::{self, Write};

/// `value`'s `Display` form with control characters escaped: see
/// [`Escaped`]. For log fields: `error = %escaped(&e)`.
pub fn escaped<T: fmt::Display>(value: T) -> Escaped<T> {
    Escaped(value)
}

/// A `Display` wrapper that writes its value's `Display` form with every
/// character that could break a log line or drive a terminal escaped as
/// Rust writes it in a string literal: `\n`, `\r`, `\t`, `\0`, `\\`, and
/// `\u{1b}` for the others (C0 and C1 controls, DEL, the Unicode line and
/// paragraph separators, and the bidirectional formatting characters,
/// which reorder how a line reads). Every other character, ordinary
/// Unicode included, is written as it is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Escaped<T>(pub T);

impl<T: fmt::Display> fmt::Display for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(EscapingWriter(f), "{}", self.0)
    }
}

impl<T: fmt::Display> fmt::Debug for Escaped<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Whether `c` is written escaped: see [`Escaped`].
fn needs_escape(c: char) -> bool {
    c.is_control()
        || c == '\\'
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}')
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
}

/// Passes text on to a formatter, escaping as it goes (no allocation).
struct EscapingWriter<'a, 'b>(&'a mut fmt::Formatter<'b>);

impl Write for EscapingWriter<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut plain = 0;
        for (i, c) in s.char_indices() {
            if !needs_escape(c) {
                continue;
            }
            self.0.write_str(&s[plain..i])?;
            match c {
                '\n' => self.0.write_str("\\n")?,
                '\r' => self.0.write_str("\\r")?,
                '\t' => self.0.write_str("\\t")?,
                '\0' => self.0.write_str("\\0")?,
                '\\' => self.0.write_str("\\\\")?,
                c => write!(self.0, "\\u{{{:x}}}", c as u32)?,
            }
            plain = i + c.len_utf8();
        }
        self.0.write_str(&s[plain..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_ordinary_unicode_kept() {
        for (raw, shown) in [
            ("plain text", "plain text"),
            ("a\nb", "a\\nb"),
            ("a\r\nb", "a\\r\\nb"),
            ("tab\there", "tab\\there"),
            ("nul\0", "nul\\0"),
            ("del\x7f", "del\\u{7f}"),
            ("\x1b[31mred\x1b[0m", "\\u{1b}[31mred\\u{1b}[0m"),
            (
                "bell\x07 bs\x08 ff\x0c vt\x0b",
                "bell\\u{7} bs\\u{8} ff\\u{c} vt\\u{b}",
            ),
            ("c1\u{9b}31m", "c1\\u{9b}31m"),
            ("line\u{2028}para\u{2029}", "line\\u{2028}para\\u{2029}"),
            ("bidi\u{202e}txt.exe", "bidi\\u{202e}txt.exe"),
            ("back\\slash \\n", "back\\\\slash \\\\n"),
            ("Zürich 東京 emoji 🦀 ñ", "Zürich 東京 emoji 🦀 ñ"),
            ("", ""),
        ] {
            assert_eq!(escaped(raw).to_string(), shown, "{raw:?}");
        }
    }

    #[test]
    fn a_forged_record_stays_on_its_line() {
        let forged = "x\n2026-12-07T00:00:00Z ERROR herald: forged\x1b[2J";
        let shown = escaped(forged).to_string();
        assert!(!shown.contains(['\n', '\r', '\x1b']), "{shown}");
        assert_eq!(
            shown,
            "x\\n2026-12-07T00:00:00Z ERROR herald: forged\\u{1b}[2J"
        );
    }

    #[test]
    fn any_display_is_escaped_and_formatting_is_the_values() {
        let err = std::io::Error::other("db said:\nsyntax error at \"\x1b\"");
        assert_eq!(
            format!("{}", escaped(&err)),
            "db said:\\nsyntax error at \"\\u{1b}\""
        );
        assert_eq!(format!("{:?}", escaped("a\nb")), "a\\nb");
        assert_eq!(escaped(42).to_string(), "42");
    }
}
