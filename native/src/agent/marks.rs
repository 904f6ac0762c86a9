//! The marks a worker starts a control line of its output with, and the one place
//! that reads them: the agent classifies each line once ([`classify`]) into a
//! [`Kind`] with the text after the mark, and only plain text goes to the rank's log
//! file and ring buffer. Python's worker writes these constants (`_wire`, from
//! `_native`), and Python's readers dispatch on the kind, never on the text.

use crate::proto::v1::log_line::Kind;

/// The end of a call's output on a stream (the worker's flush).
pub const FLUSH_MARK: &[u8] = b"\x1d monarch flush";
/// A worker's pdb waits for a line from the notebook.
pub const PROMPT_MARK: &[u8] = b"\x1d monarch pdb input";
/// A worker's `input()` waits for a line; the question follows the mark.
pub const INPUT_MARK: &[u8] = b"\x1d monarch input ";
/// A worker's rich output (DISPLAY-1): JSON of a display message follows the mark.
pub const DISPLAY_MARK: &[u8] = b"\x1d monarch display ";
/// One of the worker's actors failed (OWN-1): JSON `{"actor", "message"}` follows.
pub const ACTOR_FAILURE_MARK: &[u8] = b"\x1d monarch supervision ";

/// A line's kind and its payload (the text after the mark; the whole line for
/// text). `line` is without its origin tag and its newline.
pub fn classify(line: &[u8]) -> (Kind, &[u8]) {
    if line.first() != Some(&0x1d) {
        return (Kind::Text, line); // (the common case: one byte read)
    }
    if line == FLUSH_MARK {
        return (Kind::EndMark, b"");
    }
    if line == PROMPT_MARK {
        return (Kind::Prompt, b"");
    }
    for (mark, kind) in [
        (INPUT_MARK, Kind::Input),
        (DISPLAY_MARK, Kind::Display),
        (ACTOR_FAILURE_MARK, Kind::ActorFailure),
    ] {
        if let Some(rest) = line.strip_prefix(mark) {
            return (kind, rest);
        }
    }
    (Kind::Text, line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mark_is_its_kind_and_the_rest_is_text() {
        assert_eq!(classify(b"hello"), (Kind::Text, &b"hello"[..]));
        assert_eq!(classify(FLUSH_MARK), (Kind::EndMark, &b""[..]));
        assert_eq!(classify(PROMPT_MARK), (Kind::Prompt, &b""[..]));
        assert_eq!(
            classify(b"\x1d monarch input name? "),
            (Kind::Input, &b"name? "[..])
        );
        assert_eq!(
            classify(b"\x1d monarch display {}"),
            (Kind::Display, &b"{}"[..])
        );
        assert_eq!(
            classify(b"\x1d monarch supervision {\"a\":1}"),
            (Kind::ActorFailure, &b"{\"a\":1}"[..])
        );
        // A mark with more after it, or an unknown one, is what the user printed.
        assert_eq!(
            classify(b"\x1d monarch flush!"),
            (Kind::Text, &b"\x1d monarch flush!"[..])
        );
        assert_eq!(classify(b"\x1d other"), (Kind::Text, &b"\x1d other"[..]));
        assert_eq!(classify(b""), (Kind::Text, &b""[..]));
    }
}
