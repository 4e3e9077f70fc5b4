//! `strata serve --http`: the real binary serving the web page of a warehouse built by the
//! bundled examples (`examples/users` and `examples/music_streaming`, two pipelines in one
//! warehouse), loaded in a real browser: headless Chromium (Debian's package, which
//! scripts/test.sh installs when missing) runs the page's script and dumps the DOM, and the
//! test checks the rendered graph and run table against the plans and the tables; a
//! screenshot of each page is kept in the test's output folder (the path is printed).
//! Plain HTTP requests check the JSON endpoints, a 404, authentication and the log lines.

mod common;

use common::serve::Server;
use common::{stderr, stdout, Project};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PASSWORD: &str = "s3cret-web";
const TOKEN: &str = "t0ken-web-1234";

/// How the tests start `strata serve --http` and ask it for pages (the shared [`Server`] of
/// `common::serve`).
impl Server {
    /// Starts `strata serve --warehouse wh --http 127.0.0.1:0 extra...` in `p` with `env` and
    /// waits for the line saying where it listens.
    fn start(p: &Project, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut args = vec!["--warehouse", "wh", "--http", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        Server::spawn(p, &args, "as a web page on 127.0.0.1:", env)
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `GET path` with these extra header lines: the status, the headers and the body.
    fn get(&self, path: &str, headers: &[&str]) -> Response {
        self.request("GET", path, headers)
    }

    /// `method path` (without a body) with these extra header lines.
    fn request(&self, method: &str, path: &str, headers: &[&str]) -> Response {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Length: 0\r\n"
        );
        for h in headers {
            request.push_str(&format!("{h}\r\n"));
        }
        request.push_str("\r\n");
        s.write_all(request.as_bytes()).expect("send");
        let mut raw = String::new();
        s.read_to_string(&mut raw).expect("read the response");
        let (head, body) = raw.split_once("\r\n\r\n").expect("a response head");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("a status");
        Response {
            status,
            head: head.to_ascii_lowercase(),
            body: body.to_string(),
        }
    }
}

struct Response {
    status: u16,
    /// The status line and headers, lowercased.
    head: String,
    /// Chunked bodies are left as sent (the tests look for text in them).
    body: String,
}

/// A warehouse `wh` written by the two examples, each pipeline in a folder of its own:
/// `users/users.sql` (both files of examples/users in one run) and `music/music.sql`
/// (examples/music_streaming's two deliveries, one run each), run as its run.sh does.
fn example_warehouse() -> Project {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let p = Project::new("");
    let users = std::fs::read_to_string(examples.join("users/pipeline.sql")).expect("users");
    p.file("users/users.sql", &users);
    copy_dir(&examples.join("users/data"), &p.path("users/data"));
    let music =
        std::fs::read_to_string(examples.join("music_streaming/pipeline.sql")).expect("music");
    p.file("music/music.sql", &music);
    p.ok(&["run", "users/users.sql", "--warehouse", "wh"]);
    for batch in ["batch1", "batch2"] {
        copy_dir(
            &examples.join("music_streaming/data").join(batch),
            &p.path("music/incoming"),
        );
        p.ok(&["run", "music/music.sql", "--warehouse", "wh"]);
    }
    p
}

fn copy_dir(from: &Path, to: &Path) {
    for f in common::walk(from) {
        let target = to.join(f.strip_prefix(from).expect("under from"));
        std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&f, &target).expect("copy");
    }
}

/// Debian's `chromium` (or `chromium-browser`); the test fails, saying how to get it, when
/// neither is installed.
fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .expect("sh runs");
        if found.status.success() {
            return PathBuf::from(stdout(&found).trim());
        }
    }
    panic!(
        "chromium is not installed: the web page's browser test needs it. scripts/test.sh \
         installs Debian's package when missing (scripts/services/chromium.sh ensure); or run \
         apt-get install -y chromium"
    );
}

/// Where the screenshots go: the test's output folder, printed so it can be found.
fn output_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web");
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

/// The DOM after the page's script ran (`--dump-dom`), and a screenshot at `screenshot`.
fn browse(url: &str, screenshot: &Path) -> String {
    let browser = chromium();
    let profile = tempfile::tempdir().expect("tempdir");
    let run = |extra: &[&str]| {
        let out = Command::new(&browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--window-size=1600,2400",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(extra)
            .arg(url)
            .output()
            .expect("chromium runs");
        assert!(
            out.status.success(),
            "chromium {extra:?} {url} failed: {}",
            stderr(&out)
        );
        out
    };
    // Virtual time: the script's timers (a check for new records every 3 s) run at once.
    let dom = stdout(&run(&["--virtual-time-budget=10000", "--dump-dom"]));
    run(&[&format!("--screenshot={}", screenshot.display())]);
    let png = std::fs::read(screenshot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "not a screenshot of a page: {} bytes at {}",
        png.len(),
        screenshot.display()
    );
    println!("screenshot of {url}: {}", screenshot.display());
    dom
}

/// The value of attribute `name` in the tag text `tag` (HTML-escaped as the DOM dump has
/// it: only `&amp;` and `&quot;` matter for these names).
fn attr(tag: &str, name: &str) -> Option<String> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = tag[at..].find('"')? + at;
    Some(tag[at..end].replace("&quot;", "\"").replace("&amp;", "&"))
}

/// Every piece of `html` from a `start` (an opening tag's beginning) to `end`.
fn pieces<'a>(html: &'a str, start: &str, end: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(start) {
        let piece = &rest[at..];
        let stop = piece.find(end).map_or(piece.len(), |e| e + end.len());
        out.push(&piece[..stop]);
        rest = &piece[stop..];
    }
    out
}

/// One pipeline's section of the DOM.
fn section<'a>(dom: &'a str, pipeline: &str) -> &'a str {
    pieces(dom, "<section class=\"pipeline\"", "</section>")
        .into_iter()
        .find(|s| attr(s, "data-pipeline").as_deref() == Some(pipeline))
        .unwrap_or_else(|| panic!("no section for pipeline {pipeline} in the page:\n{dom}"))
}

/// The graph's nodes and edges as drawn.
fn drawn_graph(section: &str) -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let nodes = pieces(section, "<g class=\"node", ">")
        .iter()
        .filter_map(|g| attr(g, "data-name"))
        .collect();
    let edges = pieces(section, "<path class=\"edge\"", ">")
        .iter()
        .map(|p| {
            (
                attr(p, "data-from").expect("from"),
                attr(p, "data-to").expect("to"),
            )
        })
        .collect();
    (nodes, edges)
}

/// The plan's graph as `strata plan --format json` gives it: every name read or written,
/// and an edge per read.
fn planned_graph(p: &Project, pipeline: &str) -> (BTreeSet<String>, BTreeSet<(String, String)>) {
    let mut nodes = BTreeSet::new();
    let mut edges = BTreeSet::new();
    for line in p.ok(&["plan", pipeline, "--format", "json"]).lines() {
        let step: serde_json::Value = serde_json::from_str(line).expect("a JSON step");
        let writes = step["writes"].as_str().expect("writes").to_string();
        for read in step["reads"].as_array().expect("reads") {
            let read = read.as_str().expect("a read").to_string();
            nodes.insert(read.clone());
            edges.insert((read, writes.clone()));
        }
        nodes.insert(writes);
    }
    (nodes, edges)
}

/// A row of the run table: dataset, status and rows written, per run (newest first).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    run: String,
    dataset: String,
    status: String,
    written: i64,
}

fn run_rows(section: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for run in pieces(section, "<tbody class=\"run\"", "</tbody>") {
        let id = attr(run, "data-run").expect("a run id");
        for tr in pieces(run, "<tr class=\"record\"", "</tr>") {
            let written = tr
                .split_once("data-col=\"rows_written\">")
                .and_then(|(_, rest)| rest.split('<').next())
                .and_then(|n| n.parse().ok())
                .expect("rows written");
            out.push(Row {
                run: id.clone(),
                dataset: attr(tr, "data-dataset").expect("dataset"),
                status: attr(tr, "data-status").expect("status"),
                written,
            });
        }
    }
    out
}

fn count(p: &Project, table: &str) -> i64 {
    let sql = format!("SELECT count(*) AS n FROM {table}");
    let csv = p.ok(&["query", "--warehouse", "wh", "--format", "csv", &sql]);
    csv.lines()
        .nth(1)
        .expect("a count")
        .parse()
        .expect("a number")
}

/// The overview and a table's page in Chromium against the examples' warehouse: each
/// pipeline's graph has the plan's nodes and edges, the run table has every dataset of each
/// run with its status and the rows it wrote (which add up to the tables' rows), the page's
/// script ran; the table page shows the schema, the row count, the history and rows.
#[test]
fn chromium_renders_the_graph_and_the_runs_of_the_examples() {
    let p = example_warehouse();
    let server = Server::start(&p, &["--no-auth"], &[]);
    let out = output_dir();

    let dom = browse(&server.url("/"), &out.join("overview.png"));
    assert!(
        dom.contains("data-js=\"ready\""),
        "the page's script did not run:\n{dom}"
    );

    // Graphs: the nodes and edges the plans have, for both pipelines.
    for pipeline in ["users/users.sql", "music/music.sql"] {
        let s = section(&dom, pipeline);
        assert_eq!(
            drawn_graph(s),
            planned_graph(&p, pipeline),
            "the graph of {pipeline}"
        );
        assert!(
            !s.contains("class=\"note\""),
            "{pipeline} was not planned: {s}"
        );
    }
    let users = section(&dom, "users/users.sql");
    let (nodes, edges) = drawn_graph(users);
    assert!(nodes.contains("default.users") && nodes.contains("default.users_cdc"));
    assert!(edges.contains(&("default.users_cdc".to_string(), "default.users".to_string())));
    // A node is drawn with its last status and links to its table's page.
    let node = pieces(users, "<g class=\"node", "</g>")
        .into_iter()
        .find(|g| attr(g, "data-name").as_deref() == Some("default.users"))
        .expect("the users node");
    assert_eq!(attr(node, "data-status").as_deref(), Some("COMPLETED"));
    assert!(node.contains("href=\"/tables/default.users\""), "{node}");

    // Run table, users: one run, both datasets completed; the bronze table wrote the eight
    // events of the two files, the SCD2 target its seven versions.
    let rows = run_rows(users);
    let datasets: Vec<(&str, &str, i64)> = rows
        .iter()
        .map(|r| (r.dataset.as_str(), r.status.as_str(), r.written))
        .collect();
    assert!(
        datasets.contains(&("default.users_cdc", "COMPLETED", 8)),
        "{rows:#?}"
    );
    assert_eq!(count(&p, "users_cdc"), 8);
    assert!(rows.iter().all(|r| r.status == "COMPLETED"), "{rows:#?}");

    // Run table, music: two runs, newest first; every dataset the plan writes has a row in
    // each, and what the bronze tables wrote over both runs is what they hold.
    let music = section(&dom, "music/music.sql");
    let rows = run_rows(music);
    let runs: Vec<&str> = rows
        .iter()
        .map(|r| r.run.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(runs.len(), 2, "{rows:#?}");
    let (planned, _) = planned_graph(&p, "music/music.sql");
    let mut per_table: BTreeMap<&str, i64> = BTreeMap::new();
    for r in &rows {
        assert_eq!(r.status, "COMPLETED", "{r:?}");
        *per_table.entry(r.dataset.as_str()).or_default() += r.written;
    }
    for table in [
        "bronze_users",
        "bronze_artists",
        "bronze_tracks",
        "bronze_streams",
    ] {
        let name = format!("default.{table}");
        assert!(planned.contains(&name), "{planned:?}");
        assert_eq!(
            per_table[name.as_str()],
            count(&p, table),
            "{table}: {rows:#?}"
        );
        assert!(per_table[name.as_str()] > 0, "{table}");
    }
    // The expectations' counts are shown with their dataset.
    assert!(
        music.contains("valid_user_id (drop): "),
        "no expectation counts in:\n{music}"
    );

    // The table page: schema, the row count strata query gives, history, sample rows.
    let dom = browse(
        &server.url("/tables/default.users"),
        &out.join("table-users.png"),
    );
    assert!(
        dom.contains("<code id=\"table-name\">default.users</code>"),
        "{dom}"
    );
    assert!(
        dom.contains(&format!("data-rows=\"{}\"", count(&p, "users"))),
        "{dom}"
    );
    assert_eq!(count(&p, "users"), 7);
    let schema = pieces(&dom, "<table class=\"schema\"", "</table>").concat();
    for column in ["userId", "name", "city", "__START_AT", "__END_AT"] {
        assert!(
            schema.contains(&format!("<td>{column}</td>")),
            "{column}: {schema}"
        );
    }
    let history = pieces(&dom, "<table class=\"history\"", "</table>").concat();
    assert!(
        history.contains("<th>version</th>") && history.contains("<th>operation</th>"),
        "{history}"
    );
    assert!(pieces(&history, "<tr>", "</tr>").len() >= 2, "{history}");
    let sample = pieces(&dom, "<table class=\"sample\"", "</table>").concat();
    assert_eq!(pieces(&sample, "<tr>", "</tr>").len(), 1 + 7, "{sample}");
    assert!(sample.contains("<td>Guadalajara</td>"), "{sample}");

    assert!(server.stop().success());
}

/// JSON endpoints, an unknown table (404 with a log line), a path that is not a page, a
/// write method refused, and SIGTERM stopping the web page and the PostgreSQL listener
/// served by the same process.
#[test]
fn the_json_endpoints_answer_and_an_unknown_table_is_a_404() {
    let p = Project::new("");
    p.file(
        "users/users.sql",
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/users/pipeline.sql"),
        )
        .expect("users"),
    );
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/users/data"),
        &p.path("users/data"),
    );
    p.ok(&["run", "users/users.sql", "--warehouse", "wh"]);
    // Next to the PostgreSQL listener, in one process.
    let server = Server::start(&p, &["--no-auth", "--pg", "127.0.0.1:0"], &[]);

    let r = server.get("/api/tables/default.users", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.head.contains("content-type: application/json"),
        "{}",
        r.head
    );
    let t: serde_json::Value = serde_json::from_str(r.body.trim()).expect("JSON");
    assert_eq!(t["name"], "default.users");
    assert_eq!(t["row_count"], 7);
    assert_eq!(t["sample"]["rows"].as_array().map(Vec::len), Some(7));

    let r = server.get("/api/pipelines", &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let o: serde_json::Value = serde_json::from_str(r.body.trim()).expect("JSON");
    assert_eq!(o["pipelines"][0]["pipeline"], "users/users.sql");
    assert_eq!(o["pipelines"][0]["runs"][0]["status"], "COMPLETED");
    assert_eq!(
        o["pipelines"][0]["graph"]["edges"].as_array().map(Vec::len),
        Some(2)
    );

    let r = server.get("/tables/default.nope", &[]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("no table default.nope"), "{}", r.body);
    let r = server.get("/api/tables/nope", &[]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("\"error\""), "{}", r.body);
    assert_eq!(server.get("/nothing-here", &[]).status, 404);

    server.log_with("GET /tables/default.nope: 404 no table default.nope");
    server.log_with("GET /nothing-here: 404");
    // Read-only: only GET (and HEAD) are served.
    let r = server.request("POST", "/", &[]);
    assert_eq!(r.status, 405, "{}", r.body);
    server.log_with("POST /: 405");
    assert_eq!(server.request("HEAD", "/api/status", &[]).status, 200);

    // SIGTERM stops both listeners and the process exits 0.
    let log = server.shared_log();
    let status = server.stop();
    assert!(status.success(), "{status:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = log.lock().unwrap().clone();
        if text.contains("web page stopped") && text.contains("open connections closed") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "both listeners did not say they stopped:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// With a password (and a token), every page and endpoint asks for them: none or wrong ones
/// are refused with 401 and a basic-auth challenge, and logged without the secret; the
/// user and password or the token let the request in. Without any, the server refuses to
/// start, and `--no-auth` off loopback too.
#[test]
fn the_page_needs_the_password_or_the_token_when_they_are_set() {
    use base64::Engine;
    let p = Project::new("");
    let server = Server::start(
        &p,
        &[],
        &[
            ("STRATA_SERVE_PASSWORD", PASSWORD),
            ("STRATA_SERVE_TOKEN", TOKEN),
        ],
    );
    let basic = |user_password: &str| {
        format!(
            "Authorization: Basic {}",
            base64::engine::general_purpose::STANDARD.encode(user_password)
        )
    };
    for path in [
        "/",
        "/api/pipelines",
        "/tables/default.users",
        "/assets/page.js",
    ] {
        let r = server.get(path, &[]);
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        assert!(
            r.head.contains("www-authenticate: basic realm=\"strata\""),
            "{}",
            r.head
        );
    }
    assert_eq!(server.get("/", &[&basic("strata:wrong")]).status, 401);
    assert_eq!(server.get("/", &[&basic("other:s3cret-web")]).status, 401);
    assert_eq!(
        server.get("/", &["Authorization: Bearer wrong"]).status,
        401
    );

    let r = server.get("/", &[&basic(&format!("strata:{PASSWORD}"))]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("No runs recorded yet"), "{}", r.body);
    let r = server.get("/api/status", &[&format!("Authorization: Bearer {TOKEN}")]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("\"event_log_version\":null"), "{}", r.body);

    server.log_with("GET /: 401 refused (no credentials)");
    let log = server.log_with("GET /: 401 refused (wrong credentials)");
    assert!(!log.contains(PASSWORD) && !log.contains(TOKEN), "{log}");
    assert!(server.stop().success());

    let refused = |args: &[&str]| {
        let out = p
            .command(args)
            .env_remove("STRATA_SERVE_PASSWORD")
            .env_remove("STRATA_SERVE_TOKEN")
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{}", stderr(&out));
        stderr(&out)
    };
    let said = refused(&["serve", "--warehouse", "wh", "--http", "127.0.0.1:0"]);
    assert!(
        said.contains("--http") && said.contains("STRATA_SERVE_PASSWORD"),
        "{said}"
    );
    let said = refused(&[
        "serve",
        "--warehouse",
        "wh",
        "--http",
        "0.0.0.0:0",
        "--no-auth",
    ]);
    assert!(said.contains("only allowed on a loopback"), "{said}");
}

/// A proxy in front of the server that answers the first `GET /` with `first` (the page as
/// the server rendered it earlier) and passes every other request through: the page a
/// browser loaded before a run appended records, deterministically.
struct Proxy {
    port: u16,
}

impl Proxy {
    fn start(server_port: u16, first: Vec<u8>) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let first = Arc::new(Mutex::new(Some(first)));
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let first = first.clone();
                std::thread::spawn(move || Proxy::answer(client, server_port, &first));
            }
        });
        Proxy { port }
    }

    /// One request per connection (`Connection: close` both ways).
    fn answer(mut client: std::net::TcpStream, server_port: u16, first: &Mutex<Option<Vec<u8>>>) {
        let _ = client.set_read_timeout(Some(Duration::from_secs(30)));
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match client.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return, // a connection opened ahead and never used
            }
        }
        let head = String::from_utf8_lossy(&head).to_string();
        if head.starts_with("GET / ") {
            if let Some(page) = first.lock().unwrap().take() {
                let _ = client.write_all(&page);
                return;
            }
        }
        let mut request: String = head
            .split("\r\n")
            .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
            .map(|l| format!("{l}\r\n"))
            .collect();
        request.push_str("Connection: close\r\n\r\n");
        let Ok(mut server) = std::net::TcpStream::connect(("127.0.0.1", server_port)) else {
            return;
        };
        let _ = server.write_all(request.as_bytes());
        let _ = std::io::copy(&mut server, &mut client);
    }
}

/// The raw response to `GET path` (head and body as sent, `Connection: close`).
fn raw_get(port: u16, path: &str) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    raw
}

/// Auto-refresh: a page loaded before a run appended its records notices them (its script
/// polls `/api/status`) and reloads itself, and then shows the new run, in Chromium.
#[test]
fn an_open_page_reloads_when_a_run_appends_records() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/users");
    let p = Project::new("");
    p.file(
        "users/users.sql",
        &std::fs::read_to_string(examples.join("pipeline.sql")).expect("users"),
    );
    p.file(
        "users/data/cdc/001.json",
        &std::fs::read_to_string(examples.join("data/cdc/001.json")).expect("001"),
    );
    p.ok(&["run", "users/users.sql", "--warehouse", "wh"]);
    let server = Server::start(&p, &["--no-auth"], &[]);
    // The page as a browser got it before the second delivery's run.
    let before = raw_get(server.port, "/");
    assert!(String::from_utf8_lossy(&before).contains(" 200 OK"));
    p.file(
        "users/data/cdc/002.json",
        &std::fs::read_to_string(examples.join("data/cdc/002.json")).expect("002"),
    );
    p.ok(&["run", "users/users.sql", "--warehouse", "wh"]);

    let proxy = Proxy::start(server.port, before);
    let dom = browse(
        &format!("http://127.0.0.1:{}/", proxy.port),
        &output_dir().join("overview-reloaded.png"),
    );
    assert!(
        dom.contains("data-reloads=\"1\""),
        "the page did not reload:\n{dom}"
    );
    let rows = run_rows(section(&dom, "users/users.sql"));
    let runs: BTreeSet<&str> = rows.iter().map(|r| r.run.as_str()).collect();
    assert_eq!(runs.len(), 2, "{rows:#?}");
    // Newest first: the second delivery's two late events.
    assert_eq!(
        (rows[0].dataset.as_str(), rows[0].written),
        ("default.users_cdc", 2),
        "{rows:#?}"
    );
    assert!(server.stop().success());
}

/// A failed run: its status, the failed dataset's node and row, and the error with its
/// place (flow and dataset); a pipeline whose file is gone is drawn from the event log's
/// datasets with the reason.
#[test]
fn a_failed_run_shows_its_error_with_its_place() {
    let p = Project::new(
        "CREATE OR REFRESH STREAMING TABLE payments (\n\
           CONSTRAINT positive_amount EXPECT (amount > 0) ON VIOLATION FAIL UPDATE\n\
         ) AS SELECT * FROM STREAM read_files('data/in', format => 'json', \
           schema => 'id INT, amount INT');\n",
    );
    p.file("data/in/1.json", "{\"id\": 1, \"amount\": 5}\n");
    p.ok(&["run", "pipeline.sql", "--warehouse", "wh"]);
    p.file("data/in/2.json", "{\"id\": 2, \"amount\": -3}\n");
    let out = p.strata(&["run", "pipeline.sql", "--warehouse", "wh"]);
    assert!(!out.status.success(), "the second run should fail");
    let server = Server::start(&p, &["--no-auth"], &[]);

    let page = server.get("/", &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    let s = section(&page.body, "pipeline.sql");
    let runs = pieces(s, "<tbody class=\"run\"", "</tbody>");
    assert_eq!(runs.len(), 2, "{s}");
    assert_eq!(attr(runs[0], "data-status").as_deref(), Some("FAILED"));
    assert_eq!(attr(runs[1], "data-status").as_deref(), Some("COMPLETED"));
    let error = pieces(runs[0], "<tr class=\"error\"", "</tr>").concat();
    assert!(
        error.contains("error at payments → default.payments: ")
            && error.contains("positive_amount"),
        "{error}"
    );
    let node = pieces(s, "<g class=\"node", "</g>")
        .into_iter()
        .find(|g| attr(g, "data-name").as_deref() == Some("default.payments"))
        .expect("the payments node");
    assert_eq!(
        attr(node, "data-status").as_deref(),
        Some("FAILED"),
        "{node}"
    );
    assert!(!s.contains("class=\"note\""), "{s}");

    // The pipeline's file is gone: the graph is the datasets the log names, and says why.
    std::fs::remove_file(p.path("pipeline.sql")).expect("rm");
    let page = server.get("/", &[]);
    let s = section(&page.body, "pipeline.sql");
    assert!(s.contains("class=\"note\""), "{s}");
    assert!(s.contains("cannot be planned here"), "{s}");
    let (nodes, edges) = drawn_graph(s);
    assert_eq!(nodes, BTreeSet::from(["default.payments".to_string()]));
    assert!(edges.is_empty());
    assert!(server.stop().success());
}
