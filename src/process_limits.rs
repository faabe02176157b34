//! The per-tool process limits, each defined once: its key name, its one
//! line of documentation, its bounds (default, range, unit), the label
//! `check` and `status` give it, how the shim enforces it, and whether the
//! shim may name it as the limit that stopped a tool.
//!
//! The tools own these options (`tools` re-exports
//! [`ProcessLimits`]; the shim enforces them), and everything else reads
//! them through [`for_each_limit!`]: the configuration loader makes the
//! `[tools]` key and the `[[tool]]` key that overrides it (and the shapes
//! of the `[[tool]]` and `[[upstream]]` tables that accept it), the
//! renderer documents them, and `check`/`status` show them. This module is
//! in the foundation layer so that the loader may read it; it knows
//! nothing of the configuration's types, only its own [`Bound`].
//!
//! Adding a limit is one entry in the table below and, when it needs one,
//! its use: an rlimit is set by the shim from its entry alone.

use serde::{Deserialize, Serialize};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;
pub const DAY: u64 = 86_400;

/// What a limit's number counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Count,
    Bytes,
    Seconds,
}

/// A limit's default and range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub default: u64,
    pub min: u64,
    pub max: u64,
    pub unit: Unit,
}

impl Bound {
    const fn of(unit: Unit, default: u64, range: std::ops::RangeInclusive<u64>) -> Bound {
        Bound {
            default,
            min: *range.start(),
            max: *range.end(),
            unit,
        }
    }

    pub const fn count(default: u64, range: std::ops::RangeInclusive<u64>) -> Bound {
        Bound::of(Unit::Count, default, range)
    }

    pub const fn bytes(default: u64, range: std::ops::RangeInclusive<u64>) -> Bound {
        Bound::of(Unit::Bytes, default, range)
    }

    pub const fn secs(default: u64, range: std::ops::RangeInclusive<u64>) -> Bound {
        Bound::of(Unit::Seconds, default, range)
    }
}

/// How the shim holds a tool to a limit, in the child before `exec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforce {
    /// This rlimit, soft and hard both at the value.
    Rlimit(libc::__rlimit_resource_t),
    /// This rlimit, the hard one a unit above the soft: the soft limit's
    /// signal ends a tool that does not handle it, one that does is killed
    /// at the hard limit.
    RlimitThenKill(libc::__rlimit_resource_t),
    /// The shim counts the tool's processes, and RLIMIT_NPROC is set from
    /// the count it allows.
    Processes,
}

/// One limit's definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Its key, in `[tools]` and in a `[[tool]]` or command `[[upstream]]`
    /// table alike.
    pub name: &'static str,
    /// The `[tools]` key's one line of documentation.
    pub doc: &'static str,
    /// How `check` and `status` name what it limits.
    pub label: &'static str,
    pub bound: Bound,
    pub enforce: Enforce,
    /// Whether the shim may report it as what stopped a tool.
    pub reported: bool,
}

/// The table: calls `$callback! { { args } entries… }`, each entry
/// `/// doc` then `field (TOOLS_CONSTANT, TOOL_CONSTANT) "label": bound,
/// enforce, reported;`, in documented order. The constants name the
/// configuration's `[tools]` key and the `[[tool]]` key over it.
macro_rules! for_each_limit {
    ($callback:ident! { $($args:tt)* }) => {
        $callback! {
            { $($args)* }
            /// Virtual memory of each of a tool's processes (RLIMIT_AS); an allocation past it fails, and a tool that fails after using half of it is reported as stopped by this limit (`TG_TOOL_LIMIT`).
            max_address_space_bytes (TOOLS_MAX_ADDRESS_SPACE_BYTES, TOOL_MAX_ADDRESS_SPACE_BYTES) "address space":
                Bound::bytes(4 * GIB, 16 * MIB..=1024 * GIB), Enforce::Rlimit(libc::RLIMIT_AS), true;
            /// Open file descriptors of each of a tool's processes (RLIMIT_NOFILE).
            max_open_files (TOOLS_MAX_OPEN_FILES, TOOL_MAX_OPEN_FILES) "open files":
                Bound::count(1024, 16..=1_048_576), Enforce::Rlimit(libc::RLIMIT_NOFILE), false;
            /// Processes a tool may run at once, itself included; past it every one of them is killed and the call fails with `TG_TOOL_LIMIT` (RLIMIT_NPROC, which counts threads too, is set to the service user's count at the start plus eight times this).
            max_processes (TOOLS_MAX_PROCESSES, TOOL_MAX_PROCESSES) "processes":
                Bound::count(128, 1..=65_536), Enforce::Processes, true;
            /// Largest file a tool may write (RLIMIT_FSIZE); a write past it ends the tool with SIGXFSZ and the call fails with `TG_TOOL_LIMIT`.
            max_file_bytes (TOOLS_MAX_FILE_BYTES, TOOL_MAX_FILE_BYTES) "file size":
                Bound::bytes(GIB, KIB..=1024 * GIB), Enforce::Rlimit(libc::RLIMIT_FSIZE), true;
            /// CPU seconds of each of a tool's processes (RLIMIT_CPU); past it the process gets SIGXCPU (SIGKILL a second later) and the call fails with `TG_TOOL_LIMIT`.
            max_cpu_secs (TOOLS_MAX_CPU_SECS, TOOL_MAX_CPU_SECS) "CPU":
                Bound::secs(300, 1..=7 * DAY), Enforce::RlimitThenKill(libc::RLIMIT_CPU), true;
        }
    };
}
pub(crate) use for_each_limit;

macro_rules! define {
    (
        {}
        $(
            #[doc = $doc:literal]
            $field:ident ($TOOLS:ident, $TOOL:ident) $label:literal:
                $bound:expr, $enforce:expr, $reported:literal;
        )*
    ) => {
        /// A tool's process limits, as configured for it (its `[[tool]]`
        /// table over `[tools]`); serialised with its keys' names, in
        /// `status --json` and in the policy the shim is given.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        pub struct ProcessLimits {
            $(
                #[doc = $doc]
                pub $field: u64,
            )*
        }

        impl ProcessLimits {
            /// Every limit's definition, in documented order.
            pub const LIMITS: &'static [Limit] = &[$(
                Limit {
                    name: stringify!($field),
                    doc: $doc,
                    label: $label,
                    bound: $bound,
                    enforce: $enforce,
                    reported: $reported,
                },
            )*];

            /// Each limit's definition with its value here.
            pub fn values(&self) -> impl Iterator<Item = (&'static Limit, u64)> {
                Self::LIMITS.iter().zip([$(self.$field),*])
            }
        }

        /// Every limit at its default.
        impl Default for ProcessLimits {
            fn default() -> Self {
                ProcessLimits {
                    $($field: $bound.default,)*
                }
            }
        }

        /// The limits' key names, for the code that names one of them.
        #[allow(non_upper_case_globals, reason = "each is its field's name")]
        pub mod names {
            $(pub const $field: &str = stringify!($field);)*
        }
    };
}

for_each_limit!(define! {});

impl ProcessLimits {
    /// The definition of the limit a key names.
    pub fn named(name: &str) -> Option<&'static Limit> {
        Self::LIMITS.iter().find(|l| l.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_in_its_range_and_every_name_is_unique() {
        let defaults = ProcessLimits::default();
        for (limit, value) in defaults.values() {
            assert_eq!(value, limit.bound.default, "{}", limit.name);
            assert!(
                (limit.bound.min..=limit.bound.max).contains(&value),
                "{}",
                limit.name
            );
            assert_eq!(ProcessLimits::named(limit.name), Some(limit));
        }
        let mut names: Vec<&str> = ProcessLimits::LIMITS.iter().map(|l| l.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ProcessLimits::LIMITS.len());
    }

    #[test]
    fn serialised_with_the_keys_names() {
        let json = serde_json::to_value(ProcessLimits::default()).unwrap();
        for limit in ProcessLimits::LIMITS {
            assert_eq!(json[limit.name], limit.bound.default, "{}", limit.name);
        }
    }
}
