//! A backend's migrated schema against the dump checked in beside it
//! (`schema.sql`), shared by every backend's `tests/schema.rs`.

/// Compares `found`, the schema a fresh migrate left, with the dump at
/// `path`. With `UPDATE_SCHEMA` set it writes `found` there instead.
/// Otherwise, on a difference, panics showing the first differing lines of
/// both and `regenerate`, the command that rewrites the dump.
pub fn check(found: &str, path: &str, regenerate: &str) {
    if std::env::var_os("UPDATE_SCHEMA").is_some() {
        std::fs::write(path, found).unwrap_or_else(|e| panic!("write {path}: {e}"));
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_default();
    if found == expected {
        return;
    }
    let line = found
        .lines()
        .zip(expected.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| found.lines().count().min(expected.lines().count()));
    let around = |text: &str| -> String {
        text.lines()
            .skip(line.saturating_sub(3))
            .take(7)
            .collect::<Vec<_>>()
            .join("\n")
    };
    panic!(
        "the migrated schema differs from {path} from line {}:\n\
         --- migrated\n{}\n--- checked in\n{}\n\
         If the change is intended, regenerate the dump with `{regenerate}` and commit it.",
        line + 1,
        around(found),
        around(&expected),
    );
}
