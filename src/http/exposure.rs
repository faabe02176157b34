//! Who may reach the listener: an address off loopback is served only to
//! callers that must prove who they are (credentials in `[auth]`), over TLS
//! (here, `server.tls = "on"`, or in a proxy the operator runs,
//! `"terminated-upstream"`). Plain, unauthenticated HTTP stays on loopback.

use std::net::SocketAddr;

use thiserror::Error;

use crate::config::{Config, TlsMode, keys};
use crate::exit::{Classify, ExitClass};

/// A listener the configuration would expose without credentials or TLS
/// (78, like every configuration refusal).
#[derive(Debug, Error)]
#[error(
    "{key} = {value} (from {origin}) is not a loopback address, which needs credentials in [auth] and server.tls = \"on\" (or \"terminated-upstream\" behind a TLS proxy you run); otherwise listen on 127.0.0.1 or ::1"
)]
pub struct NotLoopback {
    pub key: String,
    pub value: SocketAddr,
    pub origin: String,
}

impl Classify for NotLoopback {
    fn exit_class(&self) -> ExitClass {
        ExitClass::Config
    }
}

/// Checks every address given for `server.listen`, one a later layer or
/// the `--listen` flag overrides included (a file that would expose the
/// daemon is wrong whatever this process was started with), against the
/// exposure policy.
pub fn check(config: &Config) -> Result<(), NotLoopback> {
    let exposed = config.auth.is_none() || config.server.tls == TlsMode::Off;
    match config
        .server
        .listen_sources
        .iter()
        .find(|(address, _)| !address.ip().is_loopback())
    {
        Some((value, origin)) if exposed => Err(NotLoopback {
            key: keys::SERVER_LISTEN.dotted(),
            value: *value,
            origin: origin.clone(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::Overrides;

    fn load(pairs: &[(&str, &str)], listen: Option<&str>) -> Config {
        let mut env: HashMap<String, String> = [("HOME".to_string(), "/h".to_string())].into();
        env.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let overrides = Overrides {
            listen: listen.map(str::to_string),
            ..Default::default()
        };
        Config::load_from(&overrides, &env).unwrap()
    }

    #[test]
    fn off_loopback_needs_credentials_and_tls_from_every_layer() {
        assert!(check(&load(&[], None)).is_ok());
        let e = check(&load(&[], Some("0.0.0.0:1"))).unwrap_err();
        assert_eq!(e.origin, "flag --listen");
        assert_eq!(e.exit_class(), ExitClass::Config);
        // A layer the flag overrides is held to it too.
        let exposed = [("TASKGATE_SERVER_LISTEN", "0.0.0.0:1")];
        let e = check(&load(&exposed, Some("127.0.0.1:1"))).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "server.listen = 0.0.0.0:1 (from environment variable TASKGATE_SERVER_LISTEN) is not a loopback address"
            ),
            "{e}"
        );
        let tokens = ("TASKGATE_AUTH_TOKENS_FILE", "/etc/taskgate/tokens.toml");
        assert!(check(&load(&[exposed[0], tokens], None)).is_err(), "no TLS");
        for tls in ["on", "terminated-upstream"] {
            let mut pairs = vec![exposed[0], tokens, ("TASKGATE_SERVER_TLS", tls)];
            if tls == "on" {
                pairs.push(("TASKGATE_SERVER_TLS_CERT_FILE", "/c.pem"));
                pairs.push(("TASKGATE_SERVER_TLS_KEY_FILE", "/k.pem"));
            }
            assert!(check(&load(&pairs, None)).is_ok(), "{tls}");
        }
    }
}
