//! Every identifier taskgate mints: one type, [`Id`], over a kind marker
//! that names its prefix and its noun. The layout (prefix, then 128 random
//! bits as 32 lower-case hex digits), the alphabet, the length and the text
//! of the refusal that names the expected shape are written here once, and
//! nowhere else mints or takes apart an ID's text.
//!
//! | kind | type | wire shape |
//! |---|---|---|
//! | task | [`TaskId`] | `tg-` and 32 hex digits |
//! | route | [`RouteId`] | `tgr-` and 32 hex digits (also the ID of the public task a route is) |
//! | lease | [`LeaseId`] | `tgl-` and 32 hex digits |
//! | proposal | [`ProposalId`] | `tgp-` and 32 hex digits |
//! | coordinator | [`CoordinatorId`] | 32 hex digits (one serving process, recorded with each dispatch) |
//! | artifact | [`ArtifactName`] | its task's ID: `<task-id>.json`, `.<task-id>.tmp` while written |
//!
//! A store's own identity (`StoreId`) is not here: the store engine
//! checks it when it opens a database, and the engine crate depends on
//! nothing of taskgate's.
//!
//! Parsing accepts exactly what minting makes: a malformed ID is refused
//! with [`IdError`], which callers usually treat as just another unknown
//! ID. The wire form is the whole text; users pass IDs around, compare,
//! store and show them as text, and never look inside.
//!
//! A shard name, later: the layout is private to this module (`Layout`),
//! so a shard would become one more field of it, written between the
//! prefix and the random part (for example `tg-<shard>.<32 hex>`, with the
//! shard's own alphabet and bound, where the dot cannot occur in the random
//! part). `Layout::read` would accept both the new form and today's (a
//! missing shard naming the default one), `Layout::mint` would take the
//! shard this process writes to, and `Id::shard` would hand it to the one
//! place that routes by it. The `Id` type, its users, the stored text of
//! existing IDs and the refusal's wording (through `shape`) would stay as
//! they are.

use std::fmt;
use std::marker::PhantomData;

use thiserror::Error;

/// What a kind of ID is called and how its text begins.
pub trait Kind {
    /// What the text begins with (empty for the internal identities).
    const PREFIX: &'static str;
    /// How an operator reads the kind in a refusal ("route", "task").
    const NOUN: &'static str;
    /// The type's name, for `Debug`.
    const TYPE: &'static str;
}

macro_rules! kinds {
    ($($(#[$doc:meta])* $marker:ident, $alias:ident, $prefix:literal, $noun:literal;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $marker {}

        impl Kind for $marker {
            const PREFIX: &'static str = $prefix;
            const NOUN: &'static str = $noun;
            const TYPE: &'static str = stringify!($alias);
        }

        $(#[$doc])*
        pub type $alias = Id<$marker>;
    )*};
}

kinds! {
    /// A public task identifier.
    Task, TaskId, "tg-", "task";
    /// A durable route's public identifier: its own prefix, so that
    /// `tasks/*` know which service answers without a read.
    Route, RouteId, "tgr-", "route";
    /// A capability lease's identifier.
    Lease, LeaseId, "tgl-", "lease";
    /// An approval proposal's identifier.
    Proposal, ProposalId, "tgp-", "proposal";
    /// One serving process's identity, minted at each start and recorded
    /// with each dispatch it makes.
    Coordinator, CoordinatorId, "", "coordinator";
}

/// The random part: 128 bits, written as lower-case hex digits.
const RANDOM_BYTES: usize = 16;
const ALPHABET: &[u8; 16] = b"0123456789abcdef";
const RANDOM_DIGITS: usize = RANDOM_BYTES * 2;

/// The layout of an ID's text after its kind's prefix. Only this module
/// sees it; it is where a shard name would be added.
struct Layout;

impl Layout {
    fn mint(prefix: &str) -> Result<String, getrandom::Error> {
        let mut bytes = [0u8; RANDOM_BYTES];
        getrandom::fill(&mut bytes)?;
        let mut text = String::with_capacity(prefix.len() + RANDOM_DIGITS);
        text.push_str(prefix);
        for b in bytes {
            text.push(char::from(ALPHABET[usize::from(b >> 4)]));
            text.push(char::from(ALPHABET[usize::from(b & 0x0f)]));
        }
        Ok(text)
    }

    /// Whether `text` is exactly what `mint(prefix)` can make.
    fn read(prefix: &str, text: &str) -> bool {
        text.strip_prefix(prefix).is_some_and(|random| {
            random.len() == RANDOM_DIGITS && random.bytes().all(|b| ALPHABET.contains(&b))
        })
    }
}

/// The expected shape of a kind's ID, as a refusal names it.
fn shape<K: Kind>() -> String {
    if K::PREFIX.is_empty() {
        format!("{RANDOM_DIGITS} hex digits")
    } else {
        format!("{} and {RANDOM_DIGITS} hex digits", K::PREFIX)
    }
}

/// A text that is not an ID of the kind asked for.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{text:?} is not a {noun} ID ({shape})")]
pub struct IdError {
    text: String,
    noun: &'static str,
    shape: String,
}

/// An identifier of kind `K`: its whole wire text, checked.
pub struct Id<K> {
    text: String,
    kind: PhantomData<fn() -> K>,
}

impl<K: Kind> Id<K> {
    /// What this kind's text begins with.
    pub const PREFIX: &'static str = K::PREFIX;

    fn new(text: String) -> Id<K> {
        Id {
            text,
            kind: PhantomData,
        }
    }

    /// A fresh identifier from the operating system's random source.
    pub fn generate() -> Result<Id<K>, getrandom::Error> {
        Layout::mint(K::PREFIX).map(Id::new)
    }

    /// Accepts only the exact shape `generate` produces.
    pub fn parse(text: &str) -> Result<Id<K>, IdError> {
        if Layout::read(K::PREFIX, text) {
            Ok(Id::new(text.to_string()))
        } else {
            Err(IdError {
                text: text.to_string(),
                noun: K::NOUN,
                shape: shape::<K>(),
            })
        }
    }

    /// Whether a text is meant as this kind's ID (it has the prefix),
    /// well-formed or not: enough to tell which service answers for it.
    pub fn claims(text: &str) -> bool {
        text.starts_with(K::PREFIX)
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn into_string(self) -> String {
        self.text
    }
}

impl TaskId {
    /// The public task a durable route is: its ID is the route's, so the
    /// protocol layer shows a route as it shows any task.
    pub fn of_route(route: &RouteId) -> TaskId {
        Id::new(route.text.clone())
    }
}

// By hand rather than derived, so that no bound falls on the marker.
impl<K> Clone for Id<K> {
    fn clone(&self) -> Self {
        Id {
            text: self.text.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> PartialEq for Id<K> {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl<K> Eq for Id<K> {}

impl<K> std::hash::Hash for Id<K> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

impl<K> PartialOrd for Id<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Id<K> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

/// `TaskId("tg-…")`, as a derived `Debug` of a newtype reads.
impl<K: Kind> fmt::Debug for Id<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple(K::TYPE).field(&self.text).finish()
    }
}

impl<K> fmt::Display for Id<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// An artifact is named by its task: `<task-id>.json` once whole,
/// `.<task-id>.tmp` while it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArtifactName {
    Whole(TaskId),
    Partial(TaskId),
}

const ARTIFACT_SUFFIX: &str = ".json";
const PARTIAL_PREFIX: &str = ".";
const PARTIAL_SUFFIX: &str = ".tmp";

impl ArtifactName {
    /// A file name in the artifacts directory, if it is one of the two
    /// forms with a well-formed task ID.
    pub fn parse(file_name: &str) -> Option<ArtifactName> {
        if let Some(id) = file_name.strip_suffix(ARTIFACT_SUFFIX) {
            return TaskId::parse(id).ok().map(ArtifactName::Whole);
        }
        file_name
            .strip_prefix(PARTIAL_PREFIX)
            .and_then(|rest| rest.strip_suffix(PARTIAL_SUFFIX))
            .and_then(|id| TaskId::parse(id).ok())
            .map(ArtifactName::Partial)
    }

    pub fn file_name(&self) -> String {
        match self {
            ArtifactName::Whole(id) => format!("{id}{ARTIFACT_SUFFIX}"),
            ArtifactName::Partial(id) => format!("{PARTIAL_PREFIX}{id}{PARTIAL_SUFFIX}"),
        }
    }

    pub fn task(&self) -> &TaskId {
        match self {
            ArtifactName::Whole(id) | ArtifactName::Partial(id) => id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Characters a single change may put in a valid ID: every hex digit,
    /// their upper-case forms, the next letters, the prefixes' letters and
    /// separators, white space, a control and multi-byte characters.
    const SUBSTITUTES: &[char] = &[
        '0', '1', '5', '9', 'a', 'b', 'c', 'd', 'e', 'f', 'A', 'F', 'g', 'l', 'p', 'r', 't', 'z',
        'G', 'T', '-', '_', '.', '/', ' ', '\0', '\n', 'é', '０', '🦀',
    ];

    /// Runs a generic check for every kind.
    macro_rules! for_every_kind {
        ($check:ident) => {
            $check::<Task>();
            $check::<Route>();
            $check::<Lease>();
            $check::<Proposal>();
            $check::<Coordinator>();
        };
    }

    /// Both names of one task's artifact.
    fn artifact_names(task: &TaskId) -> [ArtifactName; 2] {
        [
            ArtifactName::Whole(task.clone()),
            ArtifactName::Partial(task.clone()),
        ]
    }

    fn round_trips<K: Kind>() {
        let a = Id::<K>::generate().unwrap();
        let b = Id::<K>::generate().unwrap();
        assert_ne!(a, b, "two {} IDs", K::NOUN);
        assert!(a.as_str().starts_with(K::PREFIX));
        assert_eq!(a.as_str().len(), K::PREFIX.len() + 32);
        assert_eq!(Id::<K>::parse(a.as_str()), Ok(a.clone()));
        assert_eq!(Id::<K>::parse(&a.to_string()), Ok(a.clone()));
        assert!(Id::<K>::claims(a.as_str()));
        assert_eq!(a.clone().into_string(), a.as_str());
    }

    #[test]
    fn every_kind_round_trips() {
        for_every_kind!(round_trips);
        let task = TaskId::generate().unwrap();
        for name in artifact_names(&task) {
            assert_eq!(ArtifactName::parse(&name.file_name()), Some(name.clone()));
            assert_eq!(name.task(), &task);
        }
    }

    #[test]
    fn the_wire_shapes_are_as_they_always_were() {
        let task = TaskId::generate().unwrap();
        assert!(task.as_str().starts_with("tg-"));
        assert!(RouteId::generate().unwrap().as_str().starts_with("tgr-"));
        assert!(LeaseId::generate().unwrap().as_str().starts_with("tgl-"));
        assert!(ProposalId::generate().unwrap().as_str().starts_with("tgp-"));
        assert_eq!(CoordinatorId::generate().unwrap().as_str().len(), 32);
        assert_eq!(
            ArtifactName::Whole(task.clone()).file_name(),
            format!("{task}.json")
        );
        assert_eq!(
            ArtifactName::Partial(task.clone()).file_name(),
            format!(".{task}.tmp")
        );
        assert_eq!(format!("{task:?}"), format!("TaskId({:?})", task.as_str()));
        let route = RouteId::generate().unwrap();
        assert_eq!(TaskId::of_route(&route).as_str(), route.as_str());
    }

    fn refused<K: Kind>(text: &str) {
        let err = Id::<K>::parse(text).expect_err(text);
        let prefix = if K::PREFIX.is_empty() {
            String::new()
        } else {
            format!("{} and ", K::PREFIX)
        };
        assert_eq!(
            err.to_string(),
            format!("{text:?} is not a {} ID ({prefix}32 hex digits)", K::NOUN)
        );
    }

    #[test]
    fn malformed_ids_are_refused_naming_the_shape() {
        let hex = "0123456789abcdef0123456789abcdef";
        for text in [
            String::new(),
            "tg-".into(),
            "tg-XYZ".into(),
            format!("tg-{}", hex.to_uppercase()),
            format!("tg-{}", &hex[1..]),
            format!("tg-{hex}0"),
            format!("tgr-{hex}"),
            format!("TG-{hex}"),
            format!(" tg-{hex}"),
            format!("tg-{hex}\n"),
            format!("tg-{}g", &hex[1..]),
            hex.into(),
        ] {
            refused::<Task>(&text);
        }
        for text in [format!("tg-{hex}"), "tg-0123".into(), format!("tgl-{hex}")] {
            refused::<Route>(&text);
        }
        refused::<Lease>("tgl-unknown");
        refused::<Proposal>("tgp-1");
        refused::<Coordinator>(&format!("tg-{hex}"));
        refused::<Coordinator>(&hex[1..]);
        refused::<Coordinator>("unrandom");
        // The text an operator has always read for a malformed route ID.
        assert_eq!(
            RouteId::parse("x").unwrap_err().to_string(),
            "\"x\" is not a route ID (tgr- and 32 hex digits)"
        );
        for name in [
            "tg-1.json",
            &format!(".tg-{hex}.json"),
            &format!("tg-{hex}.tmp"),
            &format!(".tg-{hex}"),
            &format!("tgr-{hex}.json"),
            &format!("tg-{hex}"),
        ] {
            assert_eq!(ArtifactName::parse(name), None, "{name}");
        }
    }

    /// Every one-character change of a text: each position with each
    /// substitute, each deletion, each insertion.
    fn one_character_changes(text: &str) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let mut changed = Vec::new();
        for at in 0..=chars.len() {
            for &c in SUBSTITUTES {
                if at < chars.len() {
                    let mut v = chars.clone();
                    v[at] = c;
                    changed.push(v);
                }
                let mut v = chars.clone();
                v.insert(at, c);
                changed.push(v);
            }
            if at < chars.len() {
                let mut v = chars.clone();
                v.remove(at);
                changed.push(v);
            }
        }
        changed.into_iter().map(String::from_iter).collect()
    }

    /// Every one-character change of a valid ID either parses to another
    /// valid ID of the same kind or is refused with the kind's error.
    fn sweep<K: Kind>() {
        let valid = Id::<K>::generate().unwrap();
        for text in one_character_changes(valid.as_str()) {
            match Id::<K>::parse(&text) {
                Ok(id) => {
                    assert_eq!(id.as_str(), text);
                    if text != valid.as_str() {
                        assert_ne!(id, valid);
                    }
                    assert!(id.as_str().bytes().all(|b| b.is_ascii()));
                }
                Err(_) => refused::<K>(&text),
            }
        }
    }

    #[test]
    fn single_character_changes_parse_to_another_id_or_are_refused() {
        for_every_kind!(sweep);
        for name in artifact_names(&TaskId::generate().unwrap()) {
            for text in one_character_changes(&name.file_name()) {
                if let Some(parsed) = ArtifactName::parse(&text) {
                    assert_eq!(parsed.file_name(), text);
                }
            }
        }
    }
}
