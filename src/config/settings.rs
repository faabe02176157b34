//! How a setting is defined and read.
//!
//! [`settings!`] turns the definitions in [`super::keys`] into code: each
//! key is written once, as a field of the struct its section fills, with
//! its [`KeySpec`] (name, type, default, range, one line of documentation,
//! when it applies) on the field. From that one definition come the key's
//! constant, the typed field, the section's list of keys (what the loader,
//! the starter file and the docs walk), its `Default` and the code that
//! reads it from the [`Layers`]. How a field's Rust type is read from a
//! key's value is [`Read`]; a `Choice` key's words are those of its enum
//! ([`choice!`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::keys::{KeySpec, Kind, Unit};
use super::{ConfigError, EMBEDDED, normalize_origin, require_absolute};

/// A value one layer set, and where it came from.
pub(super) struct Setting {
    pub(super) value: toml::Value,
    pub(super) origin: String,
}

/// The values the file and the environment gave, by dotted key, a later
/// layer replacing an earlier one's; or the values of one repeated table
/// (a `[[tool]]`), named in messages after their table.
#[derive(Default)]
pub(super) struct Layers {
    values: BTreeMap<String, Setting>,
    /// For a repeated table, what a message puts before a key's name
    /// (`tool.a.`, or nothing for an `[[auth.jwt]]` table, whose origin
    /// names it); `None` for the settings.
    table: Option<String>,
}

impl Layers {
    pub(super) fn set(&mut self, key: &KeySpec, value: toml::Value, origin: String) {
        self.values.insert(key.dotted(), Setting { value, origin });
    }

    pub(super) fn get(&self, key: &KeySpec) -> Option<&Setting> {
        self.values.get(&key.dotted())
    }

    /// The values of one repeated table: its own for the keys in `keys`,
    /// and, for a key it leaves out whose default is a setting
    /// (`default_from`), that setting's value when `settings` has one. A
    /// message names a key `{named}{name}` and its origin `origin`.
    pub(super) fn table(
        keys: &[KeySpec],
        values: &toml::Table,
        settings: &Layers,
        origin: &str,
        named: String,
    ) -> Layers {
        let mut layers = Layers {
            table: Some(named),
            ..Layers::default()
        };
        for key in keys {
            if let Some(value) = values.get(key.name) {
                layers.set(key, value.clone(), origin.to_string());
            } else if let Some(set) = key.default_from.and_then(|from| settings.get(from)) {
                layers.set(key, set.value.clone(), set.origin.clone());
            }
        }
        layers
    }

    /// Where a key's value came from (the embedded default when no layer set it).
    pub(super) fn origin_of(&self, key: &KeySpec) -> String {
        self.get(key)
            .map(|s| s.origin.clone())
            .unwrap_or_else(|| EMBEDDED.to_string())
    }

    /// An integer key, checked against its range (and against the key that
    /// bounds it from above, if any).
    fn int(&self, key: &KeySpec) -> Result<u64, ConfigError> {
        let Kind::Int(spec) = key.kind else {
            return Err(mismatch(key, "an integer"));
        };
        let Some(set) = self.get(key) else {
            return Ok(spec.default);
        };
        let value = match &set.value {
            toml::Value::Integer(i) => u64::try_from(*i).ok(),
            // The environment gives text.
            toml::Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        let Some(value) = value else {
            return Err(ConfigError::Invalid {
                origin: set.origin.clone(),
                message: format!(
                    "{} must be a whole number in {}..={}",
                    key.dotted(),
                    spec.min,
                    spec.max
                ),
            });
        };
        let mut max = spec.max;
        if let Some(other) = spec.at_most {
            max = max.min(self.int(other)?);
        }
        if (spec.min..=max).contains(&value) {
            return Ok(value);
        }
        Err(match &self.table {
            // A repeated table's messages name the table (and, for a tool,
            // the tool) rather than a setting.
            Some(named) => ConfigError::Invalid {
                origin: set.origin.clone(),
                message: format!(
                    "{named}{} = {value} is out of range {}..={max}",
                    key.name, spec.min
                ),
            },
            None => ConfigError::OutOfRange {
                key: key.dotted(),
                value,
                origin: set.origin.clone(),
                min: spec.min,
                max,
            },
        })
    }

    /// A text key's value and origin, if a layer set it.
    pub(super) fn text(&self, key: &KeySpec) -> Result<Option<(String, String)>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Setting {
                value: toml::Value::String(s),
                origin,
            }) => Ok(Some((s.clone(), origin.clone()))),
            Some(set) => Err(ConfigError::Invalid {
                origin: set.origin.clone(),
                message: format!("{} must be a string", key.dotted()),
            }),
        }
    }
}

/// A definition whose kind does not fit its field's type: a mistake in
/// `keys.rs`, which the config tests load every section to catch.
fn mismatch(key: &KeySpec, what: &str) -> ConfigError {
    ConfigError::Invalid {
        origin: EMBEDDED.into(),
        message: format!(
            "{} is not {what} key, yet its field needs one",
            key.dotted()
        ),
    }
}

/// How a field's type is read from its key.
pub(super) trait Read: Sized {
    /// The value the layers give the key, checked as its kind says; its
    /// default when no layer sets it.
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError>;

    /// The key's embedded default.
    fn default_of(key: &KeySpec) -> Self;

    /// The value as text, as a reload compares it and reports a change.
    fn shown(&self, key: &KeySpec) -> String;
}

impl Read for u64 {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        layers.int(key)
    }

    fn default_of(key: &KeySpec) -> Self {
        match key.kind {
            Kind::Int(spec) => spec.default,
            _ => 0,
        }
    }

    fn shown(&self, _: &KeySpec) -> String {
        self.to_string()
    }
}

impl Read for usize {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        // Every range fits a usize on the 64-bit targets taskgate ships for.
        layers
            .int(key)
            .map(|v| usize::try_from(v).unwrap_or(usize::MAX))
    }

    fn default_of(key: &KeySpec) -> Self {
        usize::try_from(u64::default_of(key)).unwrap_or(usize::MAX)
    }

    fn shown(&self, _: &KeySpec) -> String {
        self.to_string()
    }
}

/// A duration key counts seconds or milliseconds, as its unit says.
impl Read for Duration {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        let v = layers.int(key)?;
        match key.kind {
            Kind::Int(spec) if spec.unit == Unit::Seconds => Ok(Duration::from_secs(v)),
            Kind::Int(spec) if spec.unit == Unit::Millis => Ok(Duration::from_millis(v)),
            _ => Err(mismatch(key, "a seconds or milliseconds")),
        }
    }

    fn default_of(key: &KeySpec) -> Self {
        match key.kind {
            Kind::Int(spec) if spec.unit == Unit::Millis => Duration::from_millis(spec.default),
            Kind::Int(spec) => Duration::from_secs(spec.default),
            _ => Duration::ZERO,
        }
    }

    fn shown(&self, key: &KeySpec) -> String {
        match key.kind {
            Kind::Int(spec) if spec.unit == Unit::Millis => self.as_millis().to_string(),
            _ => self.as_secs().to_string(),
        }
    }
}

/// A `Filter` key, or a `Text` key that has a default.
impl Read for String {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        match key.kind {
            Kind::Filter { .. } => filter(layers, key),
            Kind::Text {
                default: Some(default),
                ..
            } => Ok(checked_text(layers, key)?.unwrap_or_else(|| default.to_string())),
            _ => Err(mismatch(key, "a filter or a text")),
        }
    }

    fn default_of(key: &KeySpec) -> Self {
        match key.kind {
            Kind::Filter { default }
            | Kind::Text {
                default: Some(default),
                ..
            } => default.to_string(),
            _ => String::new(),
        }
    }

    fn shown(&self, _: &KeySpec) -> String {
        self.clone()
    }
}

/// A `Text` key without a default.
impl Read for Option<String> {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        match key.kind {
            Kind::Text { .. } => checked_text(layers, key),
            _ => Err(mismatch(key, "a text")),
        }
    }

    fn default_of(key: &KeySpec) -> Self {
        match key.kind {
            Kind::Text { default, .. } => default.map(str::to_string),
            _ => None,
        }
    }

    fn shown(&self, _: &KeySpec) -> String {
        self.clone().unwrap_or_default()
    }
}

/// A `File` or `Path` key: an absolute path, if set.
impl Read for Option<PathBuf> {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        if !matches!(key.kind, Kind::File { .. } | Kind::Path) {
            return Err(mismatch(key, "a path"));
        }
        match layers.text(key)? {
            None => Ok(None),
            Some((value, origin)) => {
                let path = PathBuf::from(value);
                require_absolute(key.dotted(), &path, origin)?;
                Ok(Some(path))
            }
        }
    }

    fn default_of(_: &KeySpec) -> Self {
        None
    }

    fn shown(&self, _: &KeySpec) -> String {
        self.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }
}

/// A `Paths` key: a list of absolute paths (an array of strings).
impl Read for Vec<PathBuf> {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        if key.kind != Kind::Paths {
            return Err(mismatch(key, "a list of paths"));
        }
        let Some(set) = layers.get(key) else {
            return Ok(Vec::new());
        };
        // The environment's list arrives split already (see `env_layer`).
        let texts: Option<Vec<String>> = match &set.value {
            toml::Value::Array(items) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => None,
        };
        let Some(texts) = texts else {
            return Err(ConfigError::Invalid {
                origin: set.origin.clone(),
                message: format!("{} must be a list of absolute paths", key.dotted()),
            });
        };
        let paths: Vec<PathBuf> = texts.into_iter().map(PathBuf::from).collect();
        for p in &paths {
            require_absolute(key.dotted(), p, set.origin.clone())?;
        }
        Ok(paths)
    }

    fn default_of(_: &KeySpec) -> Self {
        Vec::new()
    }

    fn shown(&self, _: &KeySpec) -> String {
        // Debug form: exact for any path, `:` included.
        format!("{self:?}")
    }
}

/// An `Origins` key, each origin in the form [`normalize_origin`] gives.
impl Read for Vec<String> {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        if key.kind != Kind::Origins {
            return Err(mismatch(key, "an origins"));
        }
        let Some(set) = layers.get(key) else {
            return Ok(Vec::new());
        };
        let invalid = |what: String| ConfigError::Invalid {
            origin: set.origin.clone(),
            message: format!(
                "{} must be a list of web origins such as \"https://console.example:8443\" (scheme, host and optional port; no path): {what}",
                key.dotted()
            ),
        };
        let toml::Value::Array(items) = &set.value else {
            return Err(invalid("not a list".into()));
        };
        items
            .iter()
            .map(|v| {
                let text = v
                    .as_str()
                    .ok_or_else(|| invalid(format!("{v} is not text")))?;
                normalize_origin(text).ok_or_else(|| invalid(format!("{text:?} is not one")))
            })
            .collect()
    }

    fn default_of(_: &KeySpec) -> Self {
        Vec::new()
    }

    fn shown(&self, _: &KeySpec) -> String {
        self.join(" ")
    }
}

/// An `Address` key.
impl Read for SocketAddr {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        let Kind::Address { default } = key.kind else {
            return Err(mismatch(key, "an address"));
        };
        match layers.text(key)? {
            Some((text, origin)) => address(key, &text, origin),
            None => address(key, default, EMBEDDED.to_string()),
        }
    }

    fn default_of(key: &KeySpec) -> Self {
        // The embedded default always parses (`keys` tests load it).
        match key.kind {
            Kind::Address { default } => default.parse().ok(),
            _ => None,
        }
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    fn shown(&self, _: &KeySpec) -> String {
        self.to_string()
    }
}

/// `text` as the socket address `key` names, or why it is not one.
pub(super) fn address(
    key: &KeySpec,
    text: &str,
    origin: String,
) -> Result<SocketAddr, ConfigError> {
    text.parse::<SocketAddr>()
        .map_err(|_| ConfigError::BadAddress {
            key: key.dotted(),
            value: text.to_string(),
            origin,
        })
}

/// An enum whose values are the words of a `Choice` key (see [`choice!`]).
pub(super) trait Choice: Copy {
    /// Every word, in the order the docs list them.
    const WORDS: &'static [&'static str];
    /// The first value: what a default that names no word would be (a
    /// `keys` test proves every default names one).
    const FIRST: Self;
    fn from_word(word: &str) -> Option<Self>;
    fn word(self) -> &'static str;
}

impl<T: Choice> Read for T {
    fn read(layers: &Layers, key: &KeySpec) -> Result<Self, ConfigError> {
        let Kind::Choice { default, choices } = key.kind else {
            return Err(mismatch(key, "a choice"));
        };
        let (word, origin) = match layers.text(key)? {
            None => (default.to_string(), EMBEDDED.to_string()),
            Some(set) => set,
        };
        match choices
            .contains(&word.as_str())
            .then(|| T::from_word(&word))
        {
            Some(Some(value)) => Ok(value),
            _ => Err(ConfigError::Invalid {
                origin,
                message: format!(
                    "{} = {word:?} is not one of {}",
                    key.dotted(),
                    choices.join(", ")
                ),
            }),
        }
    }

    fn default_of(key: &KeySpec) -> Self {
        match key.kind {
            Kind::Choice { default, .. } => T::from_word(default),
            _ => None,
        }
        .unwrap_or(T::FIRST)
    }

    fn shown(&self, _: &KeySpec) -> String {
        self.word().to_string()
    }
}

/// A tracing filter key, parsed the way the logger parses it, so that a
/// filter the logger would refuse (or half ignore) refuses the start or the
/// reload instead.
fn filter(layers: &Layers, key: &KeySpec) -> Result<String, ConfigError> {
    let Kind::Filter { default } = key.kind else {
        return Err(mismatch(key, "a filter"));
    };
    let Some((text, origin)) = layers.text(key)? else {
        return Ok(default.to_string());
    };
    match tracing_subscriber::EnvFilter::builder().parse(&text) {
        Ok(_) => Ok(text),
        Err(e) => Err(ConfigError::Invalid {
            origin,
            message: format!(
                "{} = {text:?} is not a log filter ({e}); write a level, then target=level pairs, e.g. \"info,taskgate::tasks=debug\"",
                key.dotted()
            ),
        }),
    }
}

/// A `Text` key, checked by its rule: its value, or the default.
fn checked_text(layers: &Layers, key: &KeySpec) -> Result<Option<String>, ConfigError> {
    let Kind::Text { default, rule, .. } = key.kind else {
        return Err(mismatch(key, "a text"));
    };
    match layers.text(key)? {
        None => Ok(default.map(str::to_string)),
        Some((value, origin)) => match rule.check(&value) {
            Ok(()) => Ok(Some(value)),
            Err(why) => Err(ConfigError::Invalid {
                origin,
                message: format!("{} = {value:?} {why}", key.dotted()),
            }),
        },
    }
}

/// Declares an enum whose variants are the words of a `Choice` key:
/// `Off = "off"` is the variant `Off`, written `off` in the file.
macro_rules! choice {
    (
        $(#[doc = $doc:literal])*
        pub enum $Enum:ident {
            $( $(#[doc = $vdoc:literal])* $Variant:ident = $word:literal, )*
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $Enum {
            $( $(#[doc = $vdoc])* $Variant, )*
        }

        impl $crate::config::settings::Choice for $Enum {
            const WORDS: &'static [&'static str] = &[$($word),*];
            const FIRST: Self = [$($Enum::$Variant),*][0];

            fn from_word(word: &str) -> Option<Self> {
                match word {
                    $($word => Some($Enum::$Variant),)*
                    _ => None,
                }
            }

            fn word(self) -> &'static str {
                match self {
                    $($Enum::$Variant => $word,)*
                }
            }
        }
    };
}
pub(super) use choice;

/// Defines keys, each once, as the fields of the structs they fill.
///
/// ```text
/// settings! {
///     /// The settings, in documented order.
///     pub const KEYS;
///
///     /// `[store]`: the task store.
///     pub struct StoreSettings in Store {
///         /// Commands waiting for the store thread; more are refused as busy at once.
///         #[key(STORE_QUEUE_DEPTH, "queue_depth", count(128, 1..=4096))]
///         pub queue_depth: usize,
///         …
///     }
/// }
/// ```
///
/// Each key is its doc line (exactly one, which is also the field's
/// rustdoc), then `#[key(CONSTANT, "name", kind, option: value, …)]`,
/// where the options are [`KeySpec`] fields that differ from
/// [`KeySpec::new`]'s (`applies`, `flag`, `env`, `default_from`), then the
/// field it fills, whose type says how it is read ([`Read`]). A key whose
/// value is resolved by the rules between keys in `Config::load_from`
/// (its own precedence) is written `by_rules` instead of a field. After
/// the keys, `not_a_key` fields hold what those rules fill (their
/// `Default` until then).
///
/// Generated: each `pub const CONSTANT: KeySpec`; the struct; its `KEYS`
/// (the section's keys, in order), `load` (every field read from the
/// layers), `shown` (each field's value as text, for a reload's
/// comparison) and `Default` (every field at its key's default); and the
/// list (a `const`) of every key of every struct, in order.
macro_rules! settings {
    (
        $(#[doc = $list_doc:literal])*
        pub const $LIST:ident;
        $(
            $(#[doc = $struct_doc:literal])*
            pub struct $Struct:ident in $section:ident {
                $(
                    #[doc = $doc:expr]
                    #[key($CONST:ident, $name:expr, $kind:expr $(, $opt:ident: $val:expr)* $(,)?)]
                    $(by_rules)? $(pub $field:ident: $Type:ty)?,
                )*
                $(
                    not_a_key
                    $(#[doc = $extra_doc:literal])*
                    pub $extra:ident: $Extra:ty,
                )*
            }
        )*
    ) => {
        $(
            $(
                #[doc = $doc]
                pub const $CONST: $crate::config::keys::KeySpec = $crate::config::keys::KeySpec {
                    $($opt: $val,)*
                    ..$crate::config::keys::KeySpec::new(
                        $crate::config::keys::Section::$section,
                        $name,
                        $kind,
                        $doc,
                    )
                };
            )*

            $(#[doc = $struct_doc])*
            #[derive(Debug, Clone, PartialEq, Eq)]
            pub struct $Struct {
                $($(
                    #[doc = $doc]
                    pub $field: $Type,
                )?)*
                $(
                    $(#[doc = $extra_doc])*
                    pub $extra: $Extra,
                )*
            }

            impl $Struct {
                /// This struct's keys, in documented order.
                pub const KEYS: &'static [$crate::config::keys::KeySpec] = &[$($CONST),*];

                /// Every field read from its key in `layers` (a key no
                /// layer sets takes its default), each checked as its
                /// kind says; what no key gives is left to the rules.
                pub(super) fn load(
                    layers: &$crate::config::settings::Layers,
                ) -> Result<Self, $crate::config::ConfigError> {
                    use $crate::config::settings::Read;
                    Ok($Struct {
                        $($( $field: <$Type as Read>::read(layers, &$CONST)?, )?)*
                        $( $extra: Default::default(), )*
                    })
                }

                /// Each field's key with its value as text.
                #[allow(dead_code, reason = "a repeated table's values are not compared by a reload")]
                pub(super) fn shown(&self) -> Vec<(&'static $crate::config::keys::KeySpec, String)> {
                    use $crate::config::settings::Read;
                    vec![$($( (&$CONST, Read::shown(&self.$field, &$CONST)), )?)*]
                }
            }

            impl Default for $Struct {
                fn default() -> Self {
                    use $crate::config::settings::Read;
                    $Struct {
                        $($( $field: <$Type as Read>::default_of(&$CONST), )?)*
                        $( $extra: Default::default(), )*
                    }
                }
            }
        )*

        $(#[doc = $list_doc])*
        pub const $LIST: &[$crate::config::keys::KeySpec] = &[$($($CONST,)*)*];
    };
}
pub(super) use settings;

/// Appends a field for each process limit (called through
/// `for_each_limit!`) to the shape of a table that accepts them (a
/// `[[tool]]`, a command `[[upstream]]`): so that the shape accepts them,
/// checks their type and names them among the table's keys. Their values
/// are read through their definitions, as the sections' are.
macro_rules! with_limit_fields {
    (
        { $(#[$meta:meta])* $vis:vis struct $Name:ident { $($fields:tt)* } }
        $(
            #[doc = $doc:literal]
            $field:ident ($TOOLS:ident, $TOOL:ident) $label:literal: $($definition:expr),+;
        )*
    ) => {
        $(#[$meta])*
        $vis struct $Name {
            $($fields)*
            $(
                #[allow(dead_code, reason = "read through its definition")]
                $field: Option<u64>,
            )*
        }
    };
}
pub(super) use with_limit_fields;
