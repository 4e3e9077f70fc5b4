//! What a run does when it fails and whom it tells, in Lakeflow's terms: automatic retries
//! (`pipelines.numUpdateRetryAttempts`) and notifications (`notifications: [{
//! email_recipients, alerts }]`, plus a `webhook`, strata's own), with the SMTP server that
//! sends the e-mail.
//!
//! They come from a YAML spec's `notifications` and `smtp` keys, and from pipeline
//! configuration values (a spec's `configuration`, or `--conf` for a SQL pipeline):
//!
//! ```text
//! pipelines.numUpdateRetryAttempts      2        retries of a run that failed transiently
//! strata.updateRetryBackoff             10s      pause before the first retry, doubling
//! pipelines.maxFlowRetryAttempts        2        retries of one flow (dataset) that failed
//!                                                transiently, inside the run (default 2)
//! strata.flowRetryBackoff               1s       pause before a flow's first retry, doubling
//! pipelines.notifications.webhook       URL      one notification entry from the three
//! pipelines.notifications.email_recipients  a@x,b@y     keys (the spec's list may hold
//! pipelines.notifications.alerts        on-update-failure,on-flow-failure   several)
//! strata.smtp.host / port / from / user / password_env / tls
//! ```
//!
//! Everything is checked when the pipeline is loaded: an unknown alert, a bad URL or an
//! e-mail recipient without an SMTP server fails before anything runs. A password is never
//! written here: `password_env` names the environment variable that holds it, read when a
//! message is sent.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// How many times a failed run is tried again, when nothing says (as Databricks in
/// development mode: strata has no modes, and a scheduler often retries on its own).
pub(crate) const DEFAULT_RETRIES: u32 = 0;
/// The pause before the first retry; each later one waits twice as long as the one before.
pub(crate) const DEFAULT_BACKOFF: Duration = Duration::from_secs(10);
/// The longest pause between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(600);

const RETRIES_KEY: &str = "pipelines.numUpdateRetryAttempts";
const BACKOFF_KEY: &str = "strata.updateRetryBackoff";
const FLOW_RETRIES_KEY: &str = "pipelines.maxFlowRetryAttempts";
const FLOW_BACKOFF_KEY: &str = "strata.flowRetryBackoff";

/// How many times one flow that failed transiently is tried again within a run, when
/// nothing says: Lakeflow's default (three attempts in all).
pub(crate) const DEFAULT_FLOW_RETRIES: u32 = 2;
/// The pause before a flow's first retry; each later one waits twice as long.
pub(crate) const DEFAULT_FLOW_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause between two attempts of a flow.
pub(crate) const MAX_FLOW_BACKOFF: Duration = Duration::from_secs(60);

/// Per-flow retries (`pipelines.maxFlowRetryAttempts`): a dataset or flow whose attempt
/// failed transiently (see [`crate::EngineError::is_transient`]) is prepared and run again
/// inside the same run, before the run as a whole fails (and before
/// `pipelines.numUpdateRetryAttempts` retries the run). A data or pipeline error is never
/// retried. Safe because a node commits all it wrote in one commit, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlowRetries {
    /// Attempts after the first one.
    pub(crate) retries: u32,
    /// The pause before the first retry.
    pub(crate) backoff: Duration,
}

impl Default for FlowRetries {
    fn default() -> Self {
        FlowRetries {
            retries: DEFAULT_FLOW_RETRIES,
            backoff: DEFAULT_FLOW_BACKOFF,
        }
    }
}

impl FlowRetries {
    /// The configuration's [`FLOW_RETRIES_KEY`] and [`FLOW_BACKOFF_KEY`], else the defaults;
    /// a value that does not parse is an error naming its key.
    pub(crate) fn resolve(configuration: &BTreeMap<String, String>) -> Result<FlowRetries, String> {
        let d = FlowRetries::default();
        let (retries, backoff) = retries_and_backoff(
            configuration,
            (FLOW_RETRIES_KEY, FLOW_BACKOFF_KEY),
            (d.retries, d.backoff),
        )?;
        Ok(FlowRetries { retries, backoff })
    }

    /// Whether a flow whose attempt `attempt` (1-based) failed with `e` is tried again: a
    /// transient failure, other than losing a race with another writer (the scheduler
    /// retries those on its own count), with retries left.
    pub(crate) fn retries_after(&self, attempt: u32, e: &crate::EngineError) -> bool {
        attempt <= self.retries && e.is_transient() && !e.is_conflict()
    }

    /// The pause after failed attempt `attempt` (1-based): the backoff, doubled for each
    /// attempt before, at most [`MAX_FLOW_BACKOFF`].
    pub(crate) fn pause_after(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.backoff.saturating_mul(factor).min(MAX_FLOW_BACKOFF)
    }

    /// The message of a retry: which attempt failed, and when the next one starts.
    pub(crate) fn message(&self, attempt: u32, pause: Duration) -> String {
        format!(
            "attempt {attempt} of {} of this flow failed with a transient error; retrying the \
             flow in {} ({FLOW_RETRIES_KEY} = {})",
            self.retries + 1,
            humanize(pause),
            self.retries
        )
    }
}

/// The value of configuration key `k`, trimmed; `None` when unset or blank.
fn setting<'a>(configuration: &'a BTreeMap<String, String>, k: &str) -> Option<&'a str> {
    configuration
        .get(k)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

/// A number of retries and the pause before the first, from the configuration's keys
/// `(retries, backoff)`, each `default` when unset; a value that does not parse is an error
/// naming its key.
fn retries_and_backoff(
    configuration: &BTreeMap<String, String>,
    (retries_key, backoff_key): (&str, &str),
    default: (u32, Duration),
) -> Result<(u32, Duration), String> {
    let retries = match setting(configuration, retries_key) {
        Some(v) => v
            .parse()
            .map_err(|_| format!("{retries_key}: expected a whole number of retries, got `{v}`"))?,
        None => default.0,
    };
    let backoff = match setting(configuration, backoff_key) {
        Some(v) => parse_duration(v).map_err(|m| format!("{backoff_key}: {m}"))?,
        None => default.1,
    };
    Ok((retries, backoff))
}

/// A pause as messages say it: `500 ms`, `10 s`.
pub(crate) fn humanize(d: Duration) -> String {
    if d.subsec_millis() != 0 || d.is_zero() {
        format!("{} ms", d.as_millis())
    } else {
        format!("{} s", d.as_secs())
    }
}
const NOTIFY_PREFIX: &str = "pipelines.notifications.";
const SMTP_PREFIX: &str = "strata.smtp.";

/// A run's retries and notifications.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpdateSettings {
    /// Attempts after the first one, for failures that may pass (see
    /// [`crate::EngineError::is_transient`]).
    pub(crate) retries: u32,
    /// The pause before the first retry.
    pub(crate) backoff: Duration,
    pub(crate) notifications: Vec<Notification>,
    pub(crate) smtp: Option<Smtp>,
}

impl Default for UpdateSettings {
    fn default() -> Self {
        UpdateSettings {
            retries: DEFAULT_RETRIES,
            backoff: DEFAULT_BACKOFF,
            notifications: Vec::new(),
            smtp: None,
        }
    }
}

impl UpdateSettings {
    /// Whether a run records its outcome as a whole (an `update` record): when it may be
    /// retried or someone is told.
    pub(crate) fn records_updates(&self) -> bool {
        self.retries > 0 || !self.notifications.is_empty()
    }

    /// The pause after failed attempt `attempt` (1-based): the backoff, doubled for each
    /// attempt before, at most [`MAX_BACKOFF`].
    pub(crate) fn pause_after(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.backoff.saturating_mul(factor).min(MAX_BACKOFF)
    }
}

/// One notification entry: who is told, and of what.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Notification {
    #[serde(default)]
    pub(crate) email_recipients: Vec<String>,
    /// An HTTP(S) URL the event-log record is POSTed to, as JSON.
    #[serde(default)]
    pub(crate) webhook: Option<String>,
    #[serde(default = "default_alerts")]
    pub(crate) alerts: Vec<Alert>,
}

/// Lakeflow's alert names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub(crate) enum Alert {
    /// The run completed.
    #[serde(rename = "on-update-success")]
    UpdateSuccess,
    /// The run failed (after its retries, if any).
    #[serde(rename = "on-update-failure")]
    UpdateFailure,
    /// The run failed with an error no retry could help (a data or pipeline error).
    #[serde(rename = "on-update-fatal-failure")]
    UpdateFatalFailure,
    /// A flow (or a dataset's own query) failed, failing the run.
    #[serde(rename = "on-flow-failure")]
    FlowFailure,
}

impl Alert {
    const ALL: [Alert; 4] = [
        Alert::UpdateSuccess,
        Alert::UpdateFailure,
        Alert::UpdateFatalFailure,
        Alert::FlowFailure,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Alert::UpdateSuccess => "on-update-success",
            Alert::UpdateFailure => "on-update-failure",
            Alert::UpdateFatalFailure => "on-update-fatal-failure",
            Alert::FlowFailure => "on-flow-failure",
        }
    }

    fn parse(s: &str) -> Result<Alert, String> {
        Alert::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                format!(
                    "unknown alert `{}` (known: {})",
                    s.trim(),
                    Alert::ALL.map(Alert::as_str).join(", ")
                )
            })
    }
}

/// Without `alerts`: the failures.
fn default_alerts() -> Vec<Alert> {
    vec![Alert::UpdateFailure, Alert::FlowFailure]
}

/// The SMTP server that sends notification e-mail.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Smtp {
    pub(crate) host: String,
    /// Default: 587 with STARTTLS, 465 with TLS, 25 without.
    #[serde(default)]
    pub(crate) port: Option<u16>,
    /// The sender address (`strata@example.com` or `Strata <strata@example.com>`).
    pub(crate) from: String,
    #[serde(default)]
    pub(crate) user: Option<String>,
    /// The environment variable holding the password of `user`.
    #[serde(default)]
    pub(crate) password_env: Option<String>,
    #[serde(default)]
    pub(crate) tls: SmtpTls,
}

impl Smtp {
    pub(crate) fn port(&self) -> u16 {
        self.port.unwrap_or(match self.tls {
            SmtpTls::Starttls => 587,
            SmtpTls::Tls => 465,
            SmtpTls::None => 25,
        })
    }
}

/// How the SMTP connection is protected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum SmtpTls {
    /// Plain connection upgraded with STARTTLS; a server that does not offer it is refused
    /// before anything (a password, a message) is sent.
    #[default]
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
    /// No encryption: only for a relay on this machine or a trusted network.
    None,
}

impl UpdateSettings {
    /// The settings of a pipeline: the spec's `notifications` and `smtp` (none for a SQL
    /// file), then the configuration's keys. A message says what is wrong and where.
    pub(crate) fn resolve(
        spec_notifications: Vec<Notification>,
        spec_smtp: Option<Smtp>,
        configuration: &BTreeMap<String, String>,
    ) -> Result<UpdateSettings, String> {
        let mut s = UpdateSettings {
            notifications: spec_notifications,
            smtp: spec_smtp,
            ..Default::default()
        };
        let get = |k: &str| setting(configuration, k);
        (s.retries, s.backoff) = retries_and_backoff(
            configuration,
            (RETRIES_KEY, BACKOFF_KEY),
            (s.retries, s.backoff),
        )?;
        // Read by each run; checked here so that a bad value fails before anything runs.
        FlowRetries::resolve(configuration)?;
        for key in configuration.keys() {
            let known = match key.strip_prefix(NOTIFY_PREFIX) {
                Some(rest) => ["webhook", "email_recipients", "alerts"].contains(&rest),
                None => match key.strip_prefix(SMTP_PREFIX) {
                    Some(rest) => {
                        ["host", "port", "from", "user", "password_env", "tls"].contains(&rest)
                    }
                    None => true,
                },
            };
            if !known {
                return Err(format!(
                    "{key}: unknown setting (known: {NOTIFY_PREFIX}webhook, \
                     {NOTIFY_PREFIX}email_recipients, {NOTIFY_PREFIX}alerts, \
                     {SMTP_PREFIX}host, port, from, user, password_env, tls)"
                ));
            }
        }
        let list = |k: &str| -> Vec<String> {
            get(k)
                .map(|v| {
                    v.split(',')
                        .map(|x| x.trim().to_string())
                        .filter(|x| !x.is_empty())
                        .collect()
                })
                .unwrap_or_default()
        };
        let webhook = get(&format!("{NOTIFY_PREFIX}webhook")).map(str::to_string);
        let recipients = list(&format!("{NOTIFY_PREFIX}email_recipients"));
        let alerts_key = format!("{NOTIFY_PREFIX}alerts");
        let alerts = match get(&alerts_key) {
            None => default_alerts(),
            Some(_) => list(&alerts_key)
                .iter()
                .map(|a| Alert::parse(a))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|m| format!("{alerts_key}: {m}"))?,
        };
        if webhook.is_some() || !recipients.is_empty() {
            s.notifications.push(Notification {
                email_recipients: recipients,
                webhook,
                alerts,
            });
        } else if get(&alerts_key).is_some() {
            return Err(format!(
                "{alerts_key} is set but nobody is told: set {NOTIFY_PREFIX}webhook or \
                 {NOTIFY_PREFIX}email_recipients"
            ));
        }
        if let Some(host) = get(&format!("{SMTP_PREFIX}host")) {
            let from = get(&format!("{SMTP_PREFIX}from"))
                .ok_or_else(|| format!("{SMTP_PREFIX}host is set: set {SMTP_PREFIX}from too"))?;
            let port = get(&format!("{SMTP_PREFIX}port"))
                .map(|p| {
                    p.parse::<u16>()
                        .map_err(|_| format!("{SMTP_PREFIX}port: expected a port, got `{p}`"))
                })
                .transpose()?;
            let tls = match get(&format!("{SMTP_PREFIX}tls")) {
                None => SmtpTls::default(),
                Some(t) => match t.to_ascii_lowercase().as_str() {
                    "starttls" => SmtpTls::Starttls,
                    "tls" => SmtpTls::Tls,
                    "none" => SmtpTls::None,
                    _ => {
                        return Err(format!(
                            "{SMTP_PREFIX}tls: expected starttls, tls or none, got `{t}`"
                        ))
                    }
                },
            };
            s.smtp = Some(Smtp {
                host: host.to_string(),
                port,
                from: from.to_string(),
                user: get(&format!("{SMTP_PREFIX}user")).map(str::to_string),
                password_env: get(&format!("{SMTP_PREFIX}password_env")).map(str::to_string),
                tls,
            });
        }
        s.check()?;
        Ok(s)
    }

    /// What [`UpdateSettings::resolve`] checks once everything is gathered.
    fn check(&self) -> Result<(), String> {
        for (i, n) in self.notifications.iter().enumerate() {
            let at = format!("notifications[{i}]");
            if n.webhook.is_none() && n.email_recipients.is_empty() {
                return Err(format!(
                    "{at}: nobody is told: give email_recipients or a webhook"
                ));
            }
            if n.alerts.is_empty() {
                return Err(format!("{at}: alerts: name at least one alert"));
            }
            if let Some(url) = &n.webhook {
                let parsed =
                    url::Url::parse(url).map_err(|e| format!("{at}: webhook: not a URL ({e})"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(format!(
                        "{at}: webhook: expected an http:// or https:// URL, got a {}: URL",
                        parsed.scheme()
                    ));
                }
            }
            for r in &n.email_recipients {
                if !r.contains('@') {
                    return Err(format!(
                        "{at}: email_recipients: `{r}` is not an e-mail address"
                    ));
                }
            }
            if !n.email_recipients.is_empty() && self.smtp.is_none() {
                return Err(format!(
                    "{at}: e-mail recipients need an SMTP server: add `smtp: {{ host, from }}` \
                     to the spec, or --conf {SMTP_PREFIX}host=... --conf {SMTP_PREFIX}from=..."
                ));
            }
        }
        if let Some(smtp) = &self.smtp {
            if smtp.host.trim().is_empty() {
                return Err("smtp: host: must not be empty".into());
            }
            if !smtp.from.contains('@') {
                return Err(format!(
                    "smtp: from: `{}` is not an e-mail address",
                    smtp.from
                ));
            }
            if smtp.user.is_some() != smtp.password_env.is_some() {
                return Err(
                    "smtp: user and password_env go together (the password comes from the \
                     environment variable password_env names, never from the pipeline)"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

/// `500ms`, `10s`, `2m`, `1h`, or a bare number of seconds (0 or more).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("expected a duration such as 500ms, 10s or 1m, got '{s}'"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit '{other}' (use ms, s, m or h)"
            ))
        }
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!("expected a duration of 0 or more, got '{s}'"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_sql::string_map;

    #[test]
    fn nothing_set_means_no_retries_and_nobody_told() {
        let s = UpdateSettings::resolve(Vec::new(), None, &string_map(&[("x", "1")])).unwrap();
        assert_eq!(s, UpdateSettings::default());
        assert!(!s.records_updates());
    }

    #[test]
    fn configuration_keys_make_one_entry() {
        let s = UpdateSettings::resolve(
            Vec::new(),
            None,
            &string_map(&[
                ("pipelines.numUpdateRetryAttempts", "3"),
                ("strata.updateRetryBackoff", "500ms"),
                ("pipelines.notifications.webhook", "http://127.0.0.1:9/hook"),
                (
                    "pipelines.notifications.email_recipients",
                    "a@x.org, b@y.org",
                ),
                (
                    "pipelines.notifications.alerts",
                    "on-update-success,on-update-fatal-failure",
                ),
                ("strata.smtp.host", "mail"),
                ("strata.smtp.from", "strata@x.org"),
                ("strata.smtp.tls", "none"),
            ]),
        )
        .unwrap();
        assert_eq!(s.retries, 3);
        assert_eq!(s.backoff, Duration::from_millis(500));
        assert_eq!(
            s.notifications,
            vec![Notification {
                email_recipients: vec!["a@x.org".into(), "b@y.org".into()],
                webhook: Some("http://127.0.0.1:9/hook".into()),
                alerts: vec![Alert::UpdateSuccess, Alert::UpdateFatalFailure],
            }]
        );
        let smtp = s.smtp.unwrap();
        assert_eq!((smtp.port(), smtp.tls), (25, SmtpTls::None));
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let s = UpdateSettings {
            backoff: Duration::from_secs(1),
            ..Default::default()
        };
        let pauses: Vec<u64> = (1..=4).map(|a| s.pause_after(a).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8]);
        assert_eq!(s.pause_after(40), MAX_BACKOFF);
    }

    #[test]
    fn flows_are_retried_twice_by_default_and_only_on_transient_failures() {
        let f = FlowRetries::resolve(&string_map(&[])).unwrap();
        assert_eq!(f, FlowRetries::default());
        assert_eq!((f.retries, f.backoff), (2, Duration::from_secs(1)));
        let refused = crate::EngineError::Io {
            context: "connection shop".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        let data = crate::EngineError::BadInput("a NULL key".into());
        assert!(f.retries_after(1, &refused));
        assert!(f.retries_after(2, &refused));
        assert!(!f.retries_after(3, &refused), "three attempts in all");
        assert!(!f.retries_after(1, &data), "a data error is never retried");
        let pauses: Vec<u64> = (1..=3).map(|a| f.pause_after(a).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4]);
        assert_eq!(f.pause_after(30), MAX_FLOW_BACKOFF);
        let none = FlowRetries::resolve(&string_map(&[
            ("pipelines.maxFlowRetryAttempts", "0"),
            ("strata.flowRetryBackoff", "250ms"),
        ]))
        .unwrap();
        assert!(!none.retries_after(1, &refused));
        assert_eq!(
            f.message(1, Duration::from_millis(250)),
            "attempt 1 of 3 of this flow failed with a transient error; retrying the flow in \
             250 ms (pipelines.maxFlowRetryAttempts = 2)"
        );
        let err = UpdateSettings::resolve(
            Vec::new(),
            None,
            &string_map(&[("pipelines.maxFlowRetryAttempts", "few")]),
        )
        .unwrap_err();
        assert!(
            err.contains("pipelines.maxFlowRetryAttempts: expected a whole number"),
            "{err}"
        );
    }

    #[test]
    fn mistakes_are_named() {
        let err = |pairs: &[(&str, &str)]| {
            UpdateSettings::resolve(Vec::new(), None, &string_map(pairs)).unwrap_err()
        };
        assert!(err(&[("pipelines.numUpdateRetryAttempts", "many")])
            .contains("expected a whole number"));
        assert!(err(&[
            ("pipelines.notifications.webhook", "http://h/x"),
            ("pipelines.notifications.alerts", "on-failure")
        ])
        .contains("unknown alert `on-failure` (known: on-update-success"));
        assert!(
            err(&[("pipelines.notifications.email_recipients", "a@x.org")])
                .contains("need an SMTP server")
        );
        assert!(err(&[("pipelines.notifications.webhook", "ftp://h/x")])
            .contains("expected an http:// or https:// URL"));
        assert!(err(&[("pipelines.notifications.webhok", "http://h/x")])
            .contains("pipelines.notifications.webhok: unknown setting"));
        assert!(err(&[
            ("strata.smtp.host", "mail"),
            ("strata.smtp.from", "s@x.org"),
            ("strata.smtp.user", "s")
        ])
        .contains("user and password_env go together"));
    }
}
