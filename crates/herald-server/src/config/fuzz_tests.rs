//! Bounded fuzzing of the configuration loader: arbitrary file text, and
//! arbitrary values for every known key from the file or the environment,
//! never panic, and a refused value's error names its key.

use std::collections::HashMap;
use std::io::Write;

use proptest::prelude::*;

use super::sources::ENV_KEYS;
use super::*;

/// Loads `text` as the config file, with `env` as the environment.
fn load_file(text: &str, env: &[(&str, &str)]) -> Result<ServeConfig, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.toml");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let env: HashMap<&str, &str> = env.iter().copied().collect();
    let flags = Overrides {
        config: Some(path),
        ..Overrides::default()
    };
    load(&flags, &|k| env.get(k).map(|v| v.to_string()))
}

/// Any TOML value, nested a little.
fn value() -> impl Strategy<Value = toml::Value> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(toml::Value::Integer),
        any::<f64>().prop_map(toml::Value::Float),
        any::<bool>().prop_map(toml::Value::Boolean),
        any::<String>().prop_map(toml::Value::String),
        "[0-9]{1,4}(ms|s|m|h|d|x)?".prop_map(toml::Value::String),
        Just(toml::Value::String("0".into())),
        Just(toml::Value::String(String::new())),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(toml::Value::Array),
            proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..3)
                .prop_map(|m| toml::Value::Table(m.into_iter().collect())),
        ]
    })
}

/// A known key (dotted) set to `value`, as a file writes it.
fn file_setting(key: &str, value: &toml::Value) -> String {
    let mut table = toml::Table::new();
    let mut parts: Vec<&str> = key.split('.').collect();
    let leaf = parts.pop().unwrap();
    let mut inner = toml::Table::new();
    inner.insert(leaf.to_string(), value.clone());
    let mut node = inner;
    while let Some(part) = parts.pop() {
        let mut outer = toml::Table::new();
        outer.insert(part.to_string(), toml::Value::Table(node));
        node = outer;
    }
    table.extend(node);
    toml::to_string(&table).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any text at all: loaded or refused, never a panic.
    #[test]
    fn arbitrary_file_text_never_panics(text in any::<String>()) {
        let _ = load_file(&text, &[]);
    }

    /// TOML-ish text (sections, keys, values, stray punctuation).
    #[test]
    fn tomlish_file_text_never_panics(
        text in r#"(\[{1,2}[a-z_.]{0,12}\]{0,2}\n|[a-z_.]{1,20} ?= ?("[^"\n]{0,10}"|[0-9.e+-]{1,8}|true|\[|\{)[^\n]{0,6}\n){0,8}"#
    ) {
        let _ = load_file(&text, &[]);
    }

    /// Every known key, set in the file to any value: loaded, or refused
    /// by an error that names the key.
    #[test]
    fn any_value_of_a_known_key_in_the_file_is_refused_by_name(
        i in 0..ENV_KEYS.len(),
        value in value(),
    ) {
        let (_, key, _) = ENV_KEYS[i];
        let text = file_setting(key, &value);
        if let Err(e) = load_file(&text, &[]) {
            let leaf = key.rsplit('.').next().unwrap();
            prop_assert!(e.to_string().contains(leaf), "{key} = {value}: {e}");
        }
    }

    /// Every known environment variable, set to any text: loaded, or
    /// refused by an error that names the variable or its key.
    #[test]
    fn any_value_of_a_known_variable_is_refused_by_name(
        i in 0..ENV_KEYS.len(),
        value in prop_oneof![any::<String>(), "-?[0-9]{1,25}", "[0-9]{1,5}(ms|s|m|h)"],
    ) {
        let (var, key, _) = ENV_KEYS[i];
        if let Err(e) = load_file("", &[(var, &value)]) {
            let shown = e.to_string();
            prop_assert!(shown.contains(var) || shown.contains(key), "{var}={value:?}: {shown}");
        }
    }
}
