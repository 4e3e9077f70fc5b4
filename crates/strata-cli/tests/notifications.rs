//! Failures that reach someone, on the real binary: a webhook and an SMTP server started by
//! each test on a local port (real sockets, real HTTP and SMTP conversations), retries that
//! a data error never gets, and a notification that cannot be delivered changing nothing but
//! a warning. The transient failure that is retried is in `database_retries.rs` (a real
//! PostgreSQL behind a port that opens late).

mod common;

use common::{stderr, stdout, Project};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

/// Bronze from JSON files, an SCD2 target keyed by `id`.
const PIPELINE: &str = "\
CREATE OR REFRESH STREAMING TABLE users_raw AS SELECT * FROM STREAM read_files('data/cdc', \
format => 'json', schema => 'id INT, name STRING, seq INT');
CREATE OR REFRESH STREAMING TABLE users;
CREATE FLOW users_flow AS AUTO CDC INTO users FROM STREAM(users_raw) KEYS (id)
SEQUENCE BY seq STORED AS SCD TYPE 2;
";

/// Two different rows for one key at one sequence value: a data error.
const CONFLICTING_TIE: &str = "{\"id\": 1, \"name\": \"a\", \"seq\": 1}\n\
{\"id\": 1, \"name\": \"b\", \"seq\": 1}\n";

const GOOD: &str =
    "{\"id\": 1, \"name\": \"a\", \"seq\": 1}\n{\"id\": 2, \"name\": \"b\", \"seq\": 1}\n";

/// The event log of the last run, one JSON object per record.
fn events(p: &Project) -> Vec<serde_json::Value> {
    p.ok(&["events", "--format", "json"])
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect()
}

/// A request as the test's HTTP server received it.
struct Request {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP server on a free local port that answers every request with `status` and sends
/// each request it read down the channel.
fn http_server(status: u16) -> (u16, mpsc::Receiver<Request>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            let mut line = String::new();
            reader.read_line(&mut line).expect("request line");
            let mut parts = line.split_whitespace();
            let (method, target) = (
                parts.next().unwrap_or_default().to_string(),
                parts.next().unwrap_or_default().to_string(),
            );
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).expect("header");
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.push((k.trim().to_string(), v.trim().to_string()));
                }
            }
            let length: usize = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            reader.read_exact(&mut body).expect("body");
            let mut conn = conn;
            write!(
                conn,
                "HTTP/1.1 {status} Whatever\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .expect("answer");
            let _ = tx.send(Request {
                method,
                target,
                headers,
                body: String::from_utf8(body).expect("UTF-8 body"),
            });
        }
    });
    (port, rx)
}

/// `strata run pipeline.sql` with `args`, no proxy in the way of local servers.
fn run(p: &Project, args: &[&str]) -> std::process::Output {
    let mut all = vec!["run", "pipeline.sql"];
    all.extend_from_slice(args);
    p.command(&all)
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .output()
        .expect("strata runs")
}

#[test]
fn a_failed_run_posts_its_event_log_record_to_the_webhook() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/1.json", CONFLICTING_TIE);
    let (port, requests) = http_server(204);
    let hook = format!(
        "--conf=pipelines.notifications.webhook=http://127.0.0.1:{port}/hooks/strata?team=data"
    );
    let out = run(
        &p,
        &[
            &hook,
            "--conf=pipelines.notifications.alerts=on-update-failure,on-flow-failure",
            "--retries=3",
        ],
    );
    // The notification changes nothing about the run's outcome.
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("two different upserts"),
        "{}",
        stderr(&out)
    );

    let r = requests
        .recv_timeout(Duration::from_secs(30))
        .expect("the webhook was called");
    assert_eq!(r.method, "POST");
    assert_eq!(r.target, "/hooks/strata?team=data");
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-strata-alert"), Some("on-flow-failure"));
    let body: serde_json::Value = serde_json::from_str(&r.body).expect("JSON body");
    assert_eq!(body["kind"], "update");
    assert_eq!(body["status"], "FAILED");
    assert_eq!(body["flow"], "users_flow");
    assert_eq!(body["dataset"], "default.users");
    assert_eq!(body["pipeline"], "pipeline.sql");
    let error = body["error"].as_str().expect("an error");
    assert!(
        error.contains("two different upserts for key (id=1)"),
        "{error}"
    );
    let message = body["message"].as_str().expect("a message");
    assert!(
        message.starts_with("not retried: a data or pipeline error"),
        "{message}"
    );
    // Once for the run's outcome, not once per alert or attempt.
    assert!(requests.recv_timeout(Duration::from_millis(300)).is_err());

    // The body is the record `strata events --format json` prints.
    let log = events(&p);
    let update: Vec<&serde_json::Value> = log.iter().filter(|e| e["kind"] == "update").collect();
    assert_eq!(update, [&body]);
}

#[test]
fn a_data_error_is_never_retried_and_the_event_log_says_so() {
    let p = Project::new(PIPELINE);
    // A NULL key.
    p.file(
        "data/cdc/1.json",
        "{\"id\": null, \"name\": \"a\", \"seq\": 1}\n",
    );
    let started = std::time::Instant::now();
    let out = run(
        &p,
        &[
            "--conf=pipelines.numUpdateRetryAttempts=3",
            "--conf=strata.updateRetryBackoff=20s",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the run waited for a retry"
    );
    let log = events(&p);
    let kinds: Vec<(&str, &str)> = log
        .iter()
        .map(|e| (e["kind"].as_str().unwrap(), e["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        // The ingestion checks its rows for the flow that reads them.
        [("ingest", "FAILED"), ("update", "FAILED")],
        "{log:#?}"
    );
    let update = &log[1];
    assert_eq!(
        update["message"],
        "not retried: a data or pipeline error, which another attempt would meet again \
         (attempt 1 of 4)"
    );
    assert!(
        update["error"].as_str().unwrap().contains("NULL"),
        "{update}"
    );
    let text = p.ok(&["events"]);
    assert!(
        text.contains("FAILED    update at users_raw -> default.users_raw: not retried"),
        "{text}"
    );
}

#[test]
fn a_webhook_that_cannot_be_reached_is_a_warning_and_the_run_still_succeeds() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/1.json", GOOD);
    // A port nothing listens on (bound, then released).
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let hook = format!(
        "--conf=pipelines.notifications.webhook=http://127.0.0.1:{port}/x?token=hunter2-token"
    );
    let out = run(
        &p,
        &[
            &hook,
            "--conf=pipelines.notifications.alerts=on-update-success",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out) + &stderr(&out);
    assert!(said.contains("webhook at 127.0.0.1"), "{said}");
    assert!(
        !said.contains("hunter2-token"),
        "the URL's token was printed: {said}"
    );
    let log = events(&p);
    let last = log.last().expect("records");
    assert_eq!(last["kind"], "notification");
    assert_eq!(last["status"], "WARNING");
    assert_eq!(
        last["message"],
        "on-update-success notification not delivered; the run's outcome stands"
    );
    assert!(!last["error"].as_str().unwrap().contains("hunter2-token"));
    let update = &log[log.len() - 2];
    assert_eq!(
        (&update["kind"], &update["status"]),
        (&"update".into(), &"COMPLETED".into())
    );
    assert_eq!(update["message"], "run completed (attempt 1 of 1)");
    assert_eq!(p.csv("SELECT count(*) AS n FROM users"), "n\n2\n");
}

/// What the test's SMTP server heard in one session.
#[derive(Debug, Default)]
struct Session {
    commands: Vec<String>,
    auth: Option<String>,
    data: String,
}

/// An SMTP server on a free local port: EHLO (offering AUTH PLAIN and, when `starttls`,
/// STARTTLS, which it then refuses), AUTH, MAIL FROM, RCPT TO, DATA, QUIT; each session it
/// heard goes down the channel.
fn smtp_server(starttls: bool) -> (u16, mpsc::Receiver<Session>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            conn.set_read_timeout(Some(Duration::from_secs(30))).ok();
            let mut reader = BufReader::new(conn.try_clone().expect("clone"));
            let mut s = Session::default();
            let say = |conn: &mut std::net::TcpStream, text: &str| {
                conn.write_all(text.as_bytes()).expect("answer");
            };
            say(&mut conn, "220 test.local ESMTP ready\r\n");
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let line = line.trim_end().to_string();
                let upper = line.to_ascii_uppercase();
                if upper.starts_with("EHLO") {
                    let tls = if starttls { "250-STARTTLS\r\n" } else { "" };
                    say(
                        &mut conn,
                        &format!("250-test.local\r\n{tls}250-AUTH PLAIN LOGIN\r\n250 8BITMIME\r\n"),
                    );
                } else if upper.starts_with("AUTH PLAIN ") {
                    s.auth = Some(line["AUTH PLAIN ".len()..].to_string());
                    say(&mut conn, "235 2.7.0 ok\r\n");
                } else if upper.starts_with("MAIL FROM:") || upper.starts_with("RCPT TO:") {
                    s.commands.push(line.clone());
                    say(&mut conn, "250 2.1.0 ok\r\n");
                } else if upper == "DATA" {
                    say(&mut conn, "354 go ahead\r\n");
                    loop {
                        let mut l = String::new();
                        if reader.read_line(&mut l).unwrap_or(0) == 0 || l == ".\r\n" {
                            break;
                        }
                        s.data.push_str(&l);
                    }
                    say(&mut conn, "250 2.0.0 queued\r\n");
                } else if upper == "QUIT" {
                    s.commands.push(line.clone());
                    say(&mut conn, "221 bye\r\n");
                    break;
                } else {
                    s.commands.push(line.clone());
                    say(&mut conn, "502 not here\r\n");
                }
            }
            let _ = tx.send(s);
        }
    });
    (port, rx)
}

/// The value of `name` in a message's header section (folded lines joined).
fn header(message: &str, name: &str) -> Option<String> {
    let head = message.split("\r\n\r\n").next().unwrap_or_default();
    let unfolded = head.replace("\r\n ", " ").replace("\r\n\t", " ");
    unfolded.split("\r\n").find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}

fn base64_decode(s: &str) -> Vec<u8> {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = alphabet.iter().position(|&a| a == c).expect("base64") as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
            bits &= (1 << n) - 1;
        }
    }
    out
}

const PASSWORD: &str = "s3cret-smtp-pass";

/// A YAML spec with the pipeline as its library, e-mailing `alerts` through the test server.
fn spec(p: &Project, port: u16, tls: &str, alerts: &str) {
    p.file(
        "shop.yaml",
        &format!(
            "name: shop\nlibraries: [pipeline.sql]\n\
             notifications:\n  - email_recipients: [oncall@example.com, data@example.com]\n    \
             alerts: [{alerts}]\n\
             smtp: {{ host: 127.0.0.1, port: {port}, from: strata@example.com, user: strata, \
             password_env: STRATA_TEST_SMTP_PW{tls} }}\n"
        ),
    );
}

fn run_spec(p: &Project) -> std::process::Output {
    p.command(&["run", "shop.yaml"])
        .env("STRATA_TEST_SMTP_PW", PASSWORD)
        .output()
        .expect("strata runs")
}

#[test]
fn a_run_is_e_mailed_over_smtp_without_the_password_showing_anywhere() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/1.json", GOOD);
    let (port, sessions) = smtp_server(false);
    spec(
        &p,
        port,
        ", tls: none",
        "on-update-success, on-update-failure",
    );
    let out = run_spec(&p);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = sessions
        .recv_timeout(Duration::from_secs(30))
        .expect("an SMTP session");
    assert_eq!(
        s.commands,
        [
            "MAIL FROM:<strata@example.com>",
            "RCPT TO:<oncall@example.com>",
            "RCPT TO:<data@example.com>",
            "QUIT"
        ]
    );
    // The password went to the server in AUTH, and nowhere else.
    let auth = base64_decode(s.auth.as_deref().expect("AUTH PLAIN"));
    assert_eq!(auth, format!("\0strata\0{PASSWORD}").as_bytes());
    let log = events(&p);
    let run_id = log[0]["run_id"].as_str().unwrap().to_string();
    let subject = header(&s.data, "Subject").expect("a subject");
    assert_eq!(subject, format!("[strata] shop: run {run_id} completed"));
    assert_eq!(
        header(&s.data, "To").as_deref(),
        Some("oncall@example.com, data@example.com")
    );
    assert!(s.data.contains("Alert:    on-update-success"), "{}", s.data);
    let said = stdout(&out) + &stderr(&out);
    for place in [&s.data, &said] {
        assert!(!place.contains(PASSWORD), "the password showed: {place}");
    }
    assert!(
        common::walk(&p.path("warehouse")).iter().all(|f| {
            !String::from_utf8_lossy(&std::fs::read(f).expect("read")).contains(PASSWORD)
        }),
        "the password is in the warehouse"
    );

    // A run that finds nothing new completes too, and tells no one.
    let again = run_spec(&p);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(
        sessions.recv_timeout(Duration::from_millis(500)).is_err(),
        "a run with nothing new sent e-mail"
    );
    let last = events(&p).pop().expect("records");
    assert_eq!(
        (&last["kind"], &last["status"]),
        (&"update".into(), &"COMPLETED".into())
    );
}

#[test]
fn e_mail_is_not_sent_to_a_server_that_does_not_offer_starttls() {
    let p = Project::new(PIPELINE);
    p.file("data/cdc/1.json", CONFLICTING_TIE);
    let (port, sessions) = smtp_server(false);
    // tls left at its default, STARTTLS.
    spec(&p, port, "", "on-update-failure");
    let out = run_spec(&p);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let s = sessions
        .recv_timeout(Duration::from_secs(30))
        .expect("an SMTP session");
    assert_eq!(s.auth, None, "credentials sent without TLS");
    assert_eq!(s.commands, ["QUIT"]);
    let log = events(&p);
    let last = log.last().unwrap();
    assert_eq!(
        (&last["kind"], &last["status"]),
        (&"notification".into(), &"WARNING".into())
    );
    let error = last["error"].as_str().unwrap();
    assert!(
        error.contains("does not offer STARTTLS, so nothing was sent"),
        "{error}"
    );
}
