//! Everything an operator reads about the keys, rendered from their
//! definitions in [`super::keys`]: the starter file `taskgate init` writes
//! (which is also the packaged conffile), the reference tables of
//! docs/operations.md and the taskgate.toml(5) man page.

use std::fmt::Write as _;

use crate::process_limits::ProcessLimits;

use super::keys::{
    GIB, IntSpec, JWT_KEYS, KEYS, KIB, KeySpec, Kind, MIB, Section, TOOL_KEYS, UPSTREAM_KEYS, Unit,
};

/// How a medium writes the parts of a line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Medium {
    /// Comments of the starter TOML file: plain ASCII.
    Toml,
    Markdown,
    Roff,
}

fn human_bytes(v: u64) -> String {
    for (unit, size) in [("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
        if v >= size && v.is_multiple_of(size) {
            return format!("{} {unit}", v / size);
        }
    }
    v.to_string()
}

fn value_text(spec: &IntSpec, v: u64) -> String {
    match spec.unit {
        Unit::Bytes => human_bytes(v),
        _ => v.to_string(),
    }
}

/// The default as a medium shows it (roff escaped).
fn default_text(key: &KeySpec, medium: Medium) -> String {
    if let Some(from) = key.default_from {
        let from = from.dotted();
        return match medium {
            Medium::Markdown => format!("`{from}`"),
            Medium::Roff => format!("\\fB{}\\fR", roff_escape(&from)),
            Medium::Toml => from,
        };
    }
    let text = match key.kind {
        Kind::Address { default } | Kind::Filter { default } => default.to_string(),
        Kind::Path | Kind::Paths | Kind::Origins | Kind::File { .. } => "none".to_string(),
        Kind::Int(spec) => value_text(&spec, spec.default),
        Kind::Choice { default, .. } => default.to_string(),
        Kind::Text { default, .. } => default.unwrap_or("none").to_string(),
    };
    match medium {
        Medium::Roff => roff_escape(&text),
        _ => text,
    }
}

fn range_text(key: &KeySpec, medium: Medium) -> String {
    let dash = if medium == Medium::Toml { "-" } else { "–" };
    match key.kind {
        Kind::Address { .. } => "IP:port (loopback unless [auth] and server.tls)".to_string(),
        Kind::Path | Kind::File { .. } => "absolute path".to_string(),
        Kind::Filter { .. } => "tracing filter".to_string(),
        Kind::Choice { choices, .. } => choices.join(", "),
        Kind::Text { rule, .. } => rule.label().replace('–', dash),
        Kind::Paths => "absolute paths".to_string(),
        Kind::Origins => "origins (http[s]://host[:port])".to_string(),
        Kind::Int(spec) => {
            let mut s = format!(
                "{}{dash}{}",
                value_text(&spec, spec.min),
                value_text(&spec, spec.max)
            );
            if let Some(other) = spec.at_most {
                let _ = write!(s, ", at most {}", other.dotted());
            }
            s
        }
    }
}

/// The doc line for a medium: backquoted spans become code, bold or plain.
fn doc_text(text: &str, medium: Medium) -> String {
    let mut out = String::new();
    for (i, part) in text.split('`').enumerate() {
        let code = i % 2 == 1;
        match medium {
            Medium::Markdown if code => {
                let _ = write!(out, "`{part}`");
            }
            Medium::Roff if code => {
                let _ = write!(out, "\\fB{}\\fR", roff_escape(part));
            }
            Medium::Roff => out.push_str(&roff_escape(part)),
            _ => out.push_str(part),
        }
    }
    out
}

/// Escapes text for the body of a roff line.
fn roff_escape(text: &str) -> String {
    text.replace('\\', "\\e")
        .replace('-', "\\-")
        .replace('–', "\\(en")
}

/// A roff text line, guarded against a leading control character.
fn roff_line(text: &str) -> String {
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}\n")
    } else {
        format!("{text}\n")
    }
}

fn wrap_comment(text: &str, out: &mut String) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 78 && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

/// The state directory of the packaged service (systemd's StateDirectory=).
pub const PACKAGE_STATE_DIR: &str = "/var/lib/taskgate";

/// The commented starter configuration written by `taskgate init` (and
/// shipped as the package's conffile); with a directory, `[store]
/// directory` is set to it, so that `taskgate check --config` run by an
/// operator looks where the service keeps its state.
pub fn starter_config(directory: Option<&str>) -> String {
    let mut s = String::from(
        "# taskgate configuration. Every key is optional; the values shown are the
# defaults. Settings are read at startup; `systemctl reload taskgate` (SIGHUP)
# re-reads this file and applies the tools and the keys marked \"Applied on
# reload\" to new calls, and refuses, naming it in the log, a change to any
# other key until a restart. Test the file with `taskgate check --config-only`.
# Any key can also be set in the environment as TASKGATE_<SECTION>_<KEY>, e.g.
# TASKGATE_STORE_QUEUE_DEPTH=256 (log.filter is TASKGATE_LOG); the environment
# overrides this file and command-line flags override both. See
# taskgate.toml(5).
",
    );
    for section in Section::SETTINGS {
        let _ = write!(s, "\n[{}]\n", section.name());
        for (i, key) in KEYS.iter().filter(|k| k.section == section).enumerate() {
            if i > 0 {
                s.push('\n');
            }
            let mut doc = doc_text(key.doc, Medium::Toml);
            if let Kind::Int(_) = key.kind {
                let _ = write!(doc, " Range {}.", range_text(key, Medium::Toml));
            }
            let _ = write!(doc, " {}", key.applies_text());
            wrap_comment(&doc, &mut s);
            let _ = match key.kind {
                Kind::Address { default } | Kind::Filter { default } => {
                    writeln!(s, "{} = {default:?}", key.name)
                }
                // The approval journal's directory is the state
                // directory's sibling.
                Kind::Path if section == Section::Approvals => match directory {
                    Some(d) => writeln!(s, "{} = \"{d}-approvals\"", key.name),
                    None => writeln!(s, "# {} = \"{PACKAGE_STATE_DIR}-approvals\"", key.name),
                },
                Kind::Path => match directory {
                    Some(d) => writeln!(s, "{} = {d:?}", key.name),
                    None => writeln!(s, "# {} = {PACKAGE_STATE_DIR:?}", key.name),
                },
                Kind::Paths | Kind::Origins => writeln!(s, "{} = []", key.name),
                Kind::Int(spec) => writeln!(s, "{} = {}", key.name, spec.default),
                Kind::Choice { default, .. }
                | Kind::Text {
                    default: Some(default),
                    ..
                } => writeln!(s, "{} = {default:?}", key.name),
                Kind::Text {
                    default: None,
                    example,
                    ..
                }
                | Kind::File { example } => writeln!(s, "# {} = {example:?}", key.name),
            };
        }
    }
    s.push_str(
        r#"
# A trusted issuer of JWT access tokens (RFC 9068), checked offline against
# its keys in a local JWKS file; see taskgate.toml(5) for every key.
#
# [[auth.jwt]]
# issuer = "https://idp.example.com/realms/acme"   # the exact `iss`
# jwks_file = "/etc/taskgate/jwks/acme.json"
# algorithms = ["EdDSA", "ES256", "RS256"]
# tenant_claim = "tid"          # or a fixed tenant = "acme"
# scope_claim = "scope"         # scope (space-separated) | scp (array)
"#,
    );
    s.push_str(
        r#"
# Tools are commands. This one would run `/usr/bin/date -u +FORMAT` as a
# background task for clients that negotiate Tasks; see taskgate.toml(5).
# Tools are applied on reload: new calls get the new definitions, running
# calls keep the one they started with.
#
# [[tool]]
# name = "utc_date"
# description = "Prints the current UTC date in the given strftime format."
# argv = ["/usr/bin/date", "-u", "+{format}"]
# effect = "read_only"          # read_only | idempotent_write | non_idempotent_write
# task = "optional"             # never | optional | required
# timeout_secs = 10
# [tool.input_schema]
# type = "object"
# required = ["format"]
# [tool.input_schema.properties.format]
# type = "string"
# maxLength = 64
"#,
    );
    s.push_str(
        r#"
# Upstream MCP servers: their tools are offered as ALIAS.TOOL. The effect
# (and so the scope a caller needs) is the one given here, never the
# server's own hints. Review and pin each tool with `taskgate upstream show
# ALIAS` and `taskgate upstream pin ALIAS`; see taskgate.toml(5).
#
# [[upstream]]
# alias = "files"
# command = ["/usr/local/bin/files-mcp", "--root", "/srv/shared"]
# read_paths = ["/srv/shared"]  # confined like a command tool
# effect = "read_only"          # the default of its tools
# task = "optional"             # read_only and idempotent_write tools only
#
# [[upstream]]
# alias = "tickets"
# url = "https://tickets.example.com/mcp"  # http:// only on loopback
# bearer_token_file = "/etc/taskgate/tickets.token"  # taskgate's own
# request_timeout_secs = 60
# [upstream.tools.search]
# effect = "read_only"          # the others: non_idempotent_write
"#,
    );
    s
}

/// The first and last lines around the generated table in
/// docs/operations.md.
pub const REFERENCE_BEGIN: &str =
    "<!-- configuration keys: generated by `taskgate man --reference`; edit src/config/keys.rs -->";
pub const REFERENCE_END: &str = "<!-- end of configuration keys -->";

fn markdown_rows(keys: &[KeySpec], out: &mut String) {
    // Keys of repeated tables are named without their section.
    let _ = writeln!(out, "| key | default | range | applied | meaning |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for key in keys {
        let mut meaning = doc_text(key.doc, Medium::Markdown);
        if let Some(flag) = key.flag {
            let _ = write!(meaning, " Flag: `{flag}`.");
        }
        let name = if key.section.repeated() {
            key.name.to_string()
        } else {
            key.dotted()
        };
        let _ = writeln!(
            out,
            "| `{name}` | {} | {} | {} | {meaning} |",
            default_text(key, Medium::Markdown),
            range_text(key, Medium::Markdown),
            key.applies.label(),
        );
    }
}

/// The reference tables of docs/operations.md (settings, then the bounded
/// keys of a `[[tool]]`), markers included.
pub fn reference_markdown() -> String {
    let mut s = format!("{REFERENCE_BEGIN}\n");
    markdown_rows(KEYS, &mut s);
    s.push_str("\nBounded keys of each `[[tool]]` table (see *Tools* below):\n\n");
    markdown_rows(TOOL_KEYS, &mut s);
    s.push_str("\nBounded keys of each `[[auth.jwt]]` table (see *Credentials* below):\n\n");
    markdown_rows(JWT_KEYS, &mut s);
    s.push_str(
        "\nBounded keys of each `[[upstream]]` table (see *Upstream MCP servers* below):\n\n",
    );
    markdown_rows(UPSTREAM_KEYS, &mut s);
    s.push_str(REFERENCE_END);
    s.push('\n');
    s
}

/// The process limits' keys as one parenthesised roff list, `(a, b, …;`.
fn roff_limit_list(s: &mut String) {
    let limits = ProcessLimits::LIMITS;
    for (i, limit) in limits.iter().enumerate() {
        let (request, open) = if i == 0 { (".RB", "( ") } else { (".BR", "") };
        let close = if i + 1 == limits.len() { ";" } else { "," };
        s.push_str(&format!("{request} {open}{} {close}\n", limit.name));
    }
}

fn roff_key(key: &KeySpec, out: &mut String) {
    out.push_str(".TP\n");
    let _ = writeln!(out, ".B {}", key.name);
    let mut text = doc_text(key.doc, Medium::Roff);
    let _ = write!(text, " Default {}", default_text(key, Medium::Roff));
    match key.kind {
        Kind::Int(_) => {
            let _ = write!(
                text,
                "; range {}",
                roff_escape(&range_text(key, Medium::Roff))
            );
        }
        Kind::Choice { .. } => {
            let _ = write!(
                text,
                "; one of {}",
                roff_escape(&range_text(key, Medium::Roff))
            );
        }
        _ => {}
    }
    text.push('.');
    let _ = write!(text, " {}", key.applies_text());
    if let Some(flag) = key.flag {
        let _ = write!(text, " Overridden by \\fB{}\\fR.", roff_escape(flag));
    }
    if let Some(var) = key.env_var() {
        let _ = write!(text, " Environment: {}.", roff_escape(&var));
    }
    out.push_str(&roff_line(&text));
}

/// The taskgate.toml(5) man page.
pub fn man_page() -> String {
    let mut s = format!(
        ".TH TASKGATE.TOML 5 \"\" \"taskgate {}\" \"File Formats\"\n",
        env!("CARGO_PKG_VERSION")
    );
    s.push_str(
        r#".SH NAME
taskgate.toml \- configuration of the taskgate MCP Tasks daemon
.SH SYNOPSIS
.B /etc/taskgate/taskgate.toml
.SH DESCRIPTION
A TOML file read by
.BR taskgate (1)
at startup. Every key is optional; the embedded defaults apply to keys left out.
On
.B systemctl reload taskgate
(which runs
.BR "taskgate reload" ,
waiting for the outcome) or SIGHUP the daemon reads the file again: it applies the tools and the keys marked
\(lqApplied on reload\(rq to new calls (a running call keeps the tool it started with),
refuses a change to any other key with one log line naming it (that key keeps its
old value until a restart), and keeps every old setting when the new file is invalid.
.B taskgate check \-\-config\-only
tests a file without touching the state directory, also while the daemon serves.
Any key can also be given in the environment (see ENVIRONMENT), which overrides
the file; command\-line flags override both. Unknown keys, relative paths and values out of
range refuse the start with exit status 78, naming the key.
.B taskgate init
prints a commented file with every key and its default.
"#,
    );
    for section in Section::SETTINGS {
        let _ = writeln!(s, ".SH \"[{}]\"", section.name());
        for key in KEYS.iter().filter(|k| k.section == section) {
            roff_key(key, &mut s);
        }
    }
    s.push_str(
        r#".SH "[[tool]]"
Each table declares a command tool:
.BR name ,
.BR description ,
.B argv
(absolute program path, then arguments with
.BI { name }
placeholders filled from the call's arguments; never a shell),
.B input_schema
(JSON Schema of the arguments),
.B working_dir
(absolute),
.B env
(variable names passed through),
.B effect
(read_only, idempotent_write or non_idempotent_write, the default) and
.B task
(never, the default, optional or required). A non_idempotent_write tool cannot run as a task.
Its confinement:
.B read_paths
(absolute paths it may read and execute beside the built\-in set; replaces
.BR tools.read_paths ),
.B write_paths
(absolute paths it may also write, beside its working directory) and
.B sandbox
(landlock, the default, or unconfined: written for each tool that is to run without
filesystem confinement, never a default).
.B approval
(never, the default, or required) holds each call until an administrator approved that exact
call (see
.BR [approvals] );
.B approval_preview
(at most 8 properties of its
.BR input_schema ,
only with approval = required) lists the argument values the administrator is shown with it; no
other argument value is kept. The bounded keys; a limit left out is the
.B [tools]
one:
"#,
    );
    for key in TOOL_KEYS {
        roff_key(key, &mut s);
    }
    s.push_str(
        r#".SH "[[upstream]]"
Each table puts one MCP server behind taskgate; its tools are offered to callers as
.IB alias . tool
and forwarded to it by taskgate.
.B alias
(1\(en32 characters of A\-Z a\-z 0\-9 _ \-; required, unique) names it. Exactly one of
.B command
and
.B url
says how it is reached.
.B command
(absolute program path, then its arguments; never a shell) starts a server speaking MCP on its
standard input and output, under the same shim, Landlock confinement and
.B [tools]
resource limits as a command tool, with the same
.BR env ,
.BR working_dir ,
.BR sandbox ,
.B read_paths
and
.B write_paths
keys as a
.B [[tool]]
table, and the same process limits
"#,
    );
    roff_limit_list(&mut s);
    s.push_str(
        r#"each left out is the
.B [tools]
one). They hold for the server's whole life:
.B max_cpu_secs
counts every CPU second it ever uses (past it the server is ended and started again), and a
server on a JavaScript engine reserves tens of GiB of address space.
.B url
names a streamable\-HTTP endpoint:
.B https://
(TLS checked against the system's trusted certificates, or against the PEM certificates in
.BR ca_file ),
or
.B http://
to a loopback address only (127.0.0.1, ::1, localhost). Redirects are not followed.
.B bearer_token_file
(absolute path) holds the bearer credential taskgate presents to the upstream, on its first line;
it is read at each connection, so a rotated credential needs no reload, and no tool is ever granted
it. A caller's own credential is never passed on.
.B effect
(read_only, idempotent_write or non_idempotent_write, the default) and
.B task
(never, the default, optional or required) apply to every tool of the upstream unless a
.BI [upstream.tools. NAME ]
table, under the upstream's own tool name, gives that tool its own
.B effect
or
.BR task .
The effect decides the scope a caller needs; the upstream's annotation hints are never used for
it. A non_idempotent_write tool cannot run as a task.
.B route_echo
says which of the upstream's answers must carry a durable route's execution envelope back:
.B every_answer
(the default: the task's creation and every tasks/get answer) or
.B creation_only
(weaker, for a provider that can echo only when it creates the task: a tasks/get answer without
the envelope is taken when it names the bound task). An answer about another task is never taken.
The
.B approval
and
.B approval_preview
of a tool's
.BI [upstream.tools. NAME ]
table hold its calls for an administrator as for a
.BR [[tool]] ;
an approval covers the exact call to the tool as digested when it was held (its pinned digest),
so a changed description pinned again needs a new one, and such a tool is never routed durably.
A preview field its listed
.B inputSchema
does not declare withholds the tool (named with the reason by
.B taskgate status
and
.BR "taskgate upstream show" ),
checked again each time its tool list is read. The digests of the tools an operator
reviewed are kept in
.I upstream\-pins.toml
beside this file (written by
.BR "taskgate upstream pin" );
a tool whose description changed since its pin is withheld until pinned again.
The bounded keys:
"#,
    );
    for key in UPSTREAM_KEYS {
        roff_key(key, &mut s);
    }
    s.push_str(
        r#".SH "[[auth.jwt]]"
Each table trusts one issuer of JWT access tokens, checked offline:
.B issuer
(the exact
.B iss
claim; required),
.B jwks_file
(absolute path of the issuer's public keys as a JWKS document),
.B hmac_secret_file
(absolute path of a shared secret; the only way to allow HS256, HS384 or HS512),
.B audiences
(accepted
.B aud
values; default the
.B resource
of [auth]),
.B algorithms
(allow\-list among EdDSA, ES256, ES384, RS256, RS384, RS512, PS256, PS384, PS512 and, with a secret, HS256, HS384, HS512; default EdDSA, ES256, RS256;
.B none
is never accepted),
.B require_typ
(the header's
.BR typ ,
default at+jwt as RFC 9068 asks; an empty string accepts any),
.B tenant_claim
or
.B tenant
(the claim naming the tenant, or one fixed tenant; exactly one is required),
.B scope_claim
(scope, a space\-separated string, the default; or scp, an array) and
.B advertise
(list the issuer as an authorization server in the protected resource metadata; default false).
The bounded keys:
"#,
    );
    for key in JWT_KEYS {
        roff_key(key, &mut s);
    }
    s.push_str(
        r#".SH ENVIRONMENT
.TP
.BI TASKGATE_ SECTION _ KEY
Any key of [server], [store], [tasks] and [auth], for example
.BR TASKGATE_STORE_QUEUE_DEPTH=256 .
It overrides the file; a command\-line flag overrides it. A variable with this prefix
that names no key refuses the start (78). [[tool]], [[upstream]] and [[auth.jwt]] keys have no
variables.
.TP
.B TASKGATE_LOG
The log filter,
.BR "[log] filter" .
Set, it overrides the file, also on reload: a changed filter in the file is then
not applied.
.TP
.B TASKGATE_CONFIG
The configuration file, when
.B \-\-config
is not given.
.TP
.B STATE_DIRECTORY
Set by systemd's StateDirectory=: the state directory, ahead of
.BR "[store] directory" ,
which must then name the same directory or be left out.
.TP
.B XDG_STATE_HOME
Without any other choice the state directory is $XDG_STATE_HOME/taskgate
(~/.local/state/taskgate), created 0700.
.TP
.B RUNTIME_DIRECTORY
Set by systemd's RuntimeDirectory=: where the admin socket is made.
.SH FILES
.TP
.I /var/lib/taskgate
The state directory: tasks.db, its \-wal and \-shm files, tasks.lock and artifacts/.
.TP
.I /etc/taskgate/upstream\-pins.toml
The reviewed digests of the upstreams' tools, beside the configuration file (whatever its
directory); written by
.BR "taskgate upstream pin" ,
read at start and on reload. Like the configuration file, no tool may reach it.
.SH "SEE ALSO"
.BR taskgate (1),
.BR taskgate\-backup (8),
.BR taskgate\-restore (8),
/usr/share/doc/taskgate/operations.md
"#,
    );
    s
}
