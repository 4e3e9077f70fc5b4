//! The pages as HTML (pure): built from the model as text, every value from the warehouse
//! escaped; the graph an inline SVG. The stylesheet and the script (`page.css`, `page.js`)
//! are embedded in the binary and served from `/assets/`.

use super::model::{GraphView, Grid, NodeView, Overview, PipelineView, RunView, TablePage};
use super::model::{NODE_HEIGHT, NODE_WIDTH};
use std::fmt::Write;
use strata_engine::LoggedEvent;

/// `s` for HTML text and attribute values (quoted with `"`).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The path of a table's page (its name percent-encoded where a URL path needs it).
pub fn table_href(name: &str) -> String {
    let mut out = String::from("/tables/");
    for b in name.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => out.push(b as char),
            other => {
                let _ = write!(out, "%{other:02X}");
            }
        }
    }
    out
}

/// A whole page: `attributes` go on `<html>` (already escaped).
fn page(title: &str, attributes: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"{attributes}>\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<link rel=\"stylesheet\" href=\"/assets/page.css\">\n\
         <script src=\"/assets/page.js\" defer></script>\n</head>\n<body>\n\
         <header><a class=\"home\" href=\"/\">strata</a> <span id=\"live\"></span></header>\n\
         <main>\n{body}</main>\n</body>\n</html>\n",
        escape(title)
    )
}

/// The overview: each pipeline's graph and last runs, then the list of tables.
pub fn overview_page(o: &Overview) -> String {
    let mut body = format!("<h1>Warehouse <code>{}</code></h1>\n", escape(&o.warehouse));
    if o.pipelines.is_empty() {
        body.push_str(
            "<p class=\"empty\">No runs recorded yet: the event log is written by \
             <code>strata run</code>.</p>\n",
        );
    }
    for p in &o.pipelines {
        body.push_str(&pipeline_section(p));
    }
    body.push_str("<section class=\"tables\">\n<h2>Tables</h2>\n<ul id=\"tables\">\n");
    for t in &o.tables {
        let _ = writeln!(
            body,
            "<li><a href=\"{}\">{}</a></li>",
            escape(&table_href(t)),
            escape(t)
        );
    }
    body.push_str("</ul>\n</section>\n");
    let version = o
        .event_log_version
        .map_or("none".to_string(), |v| v.to_string());
    page(
        "strata: warehouse",
        &format!(" data-event-log-version=\"{version}\""),
        &body,
    )
}

fn pipeline_section(p: &PipelineView) -> String {
    let mut out = format!(
        "<section class=\"pipeline\" data-pipeline=\"{0}\">\n<h2>Pipeline <code>{0}</code></h2>\n",
        escape(&p.pipeline)
    );
    if let Some(note) = &p.graph_note {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", escape(note));
    }
    out.push_str(&graph_svg(&p.graph));
    out.push_str("<h3>Last runs</h3>\n");
    out.push_str(&runs_table(&p.runs));
    out.push_str("</section>\n");
    out
}

/// At most `max` characters of `s`, with `…` when cut.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

fn status_class(status: Option<&str>) -> String {
    format!("status-{}", status.unwrap_or("none").to_ascii_lowercase())
}

/// The graph as an inline SVG: a box per node (a link to its table's page), a curve per
/// read with an arrow head.
pub fn graph_svg(g: &GraphView) -> String {
    let mut out = format!(
        "<svg class=\"graph\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" \
         viewBox=\"0 0 {0} {1}\" role=\"img\">\n<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" \
         refX=\"10\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">\
         <path d=\"M 0 0 L 10 5 L 0 10 z\"/></marker></defs>\n",
        g.width, g.height
    );
    let at = |name: &str| g.nodes.iter().find(|n| n.name == name);
    for e in &g.edges {
        let (Some(f), Some(t)) = (at(&e.from), at(&e.to)) else {
            continue;
        };
        let (x1, y1) = (f.x + NODE_WIDTH, f.y + NODE_HEIGHT / 2);
        let (x2, y2) = (t.x, t.y + NODE_HEIGHT / 2);
        let bend = (x2.saturating_sub(x1)) / 2;
        let _ = writeln!(
            out,
            "<path class=\"edge\" data-from=\"{}\" data-to=\"{}\" d=\"M {x1} {y1} C {} {y1}, {} {y2}, \
             {x2} {y2}\" marker-end=\"url(#arrow)\"><title>{}</title></path>",
            escape(&e.from),
            escape(&e.to),
            x1 + bend,
            x2.saturating_sub(bend),
            escape(&e.step)
        );
    }
    for n in &g.nodes {
        out.push_str(&node_svg(n));
    }
    out.push_str("</svg>\n");
    out
}

fn node_svg(n: &NodeView) -> String {
    let kind = if n.written { "dataset" } else { "input" };
    let title = match n.detail.is_empty() {
        true => n.name.clone(),
        false => format!("{}: {}", n.name, n.detail),
    };
    let shapes = format!(
        "<rect x=\"{}\" y=\"{}\" width=\"{NODE_WIDTH}\" height=\"{NODE_HEIGHT}\" rx=\"6\"/>\
         <text class=\"name\" x=\"{}\" y=\"{}\">{}</text><text class=\"detail\" x=\"{}\" y=\"{}\">{}</text>",
        n.x,
        n.y,
        n.x + 8,
        n.y + 18,
        escape(&cut(&n.name, 27)),
        n.x + 8,
        n.y + 35,
        escape(&cut(if n.written { &n.detail } else { "input" }, 36)),
    );
    let inner = match n.is_table {
        true => format!("<a href=\"{}\">{shapes}</a>", escape(&table_href(&n.name))),
        false => shapes,
    };
    format!(
        "<g class=\"node {kind} {}\" data-name=\"{}\" data-status=\"{}\"><title>{}</title>{inner}</g>\n",
        status_class(n.status.as_deref()),
        escape(&n.name),
        escape(n.status.as_deref().unwrap_or("")),
        escape(&title)
    )
}

const RUN_COLUMNS: [&str; 13] = [
    "Dataset",
    "Flow",
    "Kind",
    "Status",
    "ms",
    "Read",
    "Written",
    "Upserted",
    "Deleted",
    "Versions opened",
    "Versions closed",
    "Dropped",
    "Expectations",
];

/// The runs, newest first: a header row per run, a row per dataset or flow, its error under it.
pub fn runs_table(runs: &[RunView]) -> String {
    let mut out = String::from("<table class=\"runs\">\n<thead><tr>");
    for c in RUN_COLUMNS {
        let _ = write!(out, "<th>{c}</th>");
    }
    out.push_str("</tr></thead>\n");
    for run in runs {
        let _ = writeln!(
            out,
            "<tbody class=\"run\" data-run=\"{0}\" data-status=\"{1}\">\n<tr class=\"run-head\">\
             <th colspan=\"{2}\">Run <code>{0}</code>, started <time datetime=\"{3}\">{3}</time>: \
             <span class=\"{4}\">{1}</span></th></tr>",
            escape(&run.run_id),
            escape(&run.status),
            RUN_COLUMNS.len(),
            escape(&run.started),
            status_class(Some(&run.status)),
        );
        for e in &run.datasets {
            out.push_str(&record_row(e));
        }
        for e in &run.run_records {
            let at = match e.flow.is_empty() {
                true => String::new(),
                false => format!(" at {} → {}", e.flow, e.dataset),
            };
            let _ = writeln!(
                out,
                "<tr class=\"run-record\"><td colspan=\"{}\">{} <span class=\"{}\">{}</span>{}: {}</td></tr>",
                RUN_COLUMNS.len(),
                escape(&e.kind),
                status_class(Some(&e.status)),
                escape(&e.status),
                escape(&at),
                escape(e.message.as_deref().unwrap_or(""))
            );
            out.push_str(&error_row(e));
        }
        out.push_str("</tbody>\n");
    }
    out.push_str("</table>\n");
    out
}

fn record_row(e: &LoggedEvent) -> String {
    let dataset = match e.dataset.is_empty() {
        true => String::new(),
        false => format!(
            "<a href=\"{}\">{}</a>",
            escape(&table_href(&e.dataset)),
            escape(&e.dataset)
        ),
    };
    let expectations: Vec<String> = e
        .expectations
        .iter()
        .map(|x| {
            format!(
                "<span class=\"expectation{}\">{} ({}): {} passed, {} failed</span>",
                if x.failed > 0 { " failed" } else { "" },
                escape(&x.name),
                escape(&x.action),
                x.passed,
                x.failed
            )
        })
        .collect();
    let mut out = format!(
        "<tr class=\"record\" data-dataset=\"{}\" data-flow=\"{}\" data-status=\"{}\">\
         <td>{dataset}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td>",
        escape(&e.dataset),
        escape(&e.flow),
        escape(&e.status),
        escape(&e.flow),
        escape(&e.kind),
        status_class(Some(&e.status)),
        escape(&e.status),
    );
    for (name, v) in [
        ("duration_ms", e.duration_ms),
        ("rows_read", e.rows_read),
        ("rows_written", e.rows_written),
        ("rows_upserted", e.rows_upserted),
        ("rows_deleted", e.rows_deleted),
        ("versions_opened", e.versions_opened),
        ("versions_closed", e.versions_closed),
        ("rows_dropped", e.rows_dropped),
    ] {
        let _ = write!(out, "<td class=\"n\" data-col=\"{name}\">{v}</td>");
    }
    let _ = writeln!(
        out,
        "<td class=\"expectations\">{}</td></tr>",
        expectations.join("<br>")
    );
    if let Some(message) = e.message.as_deref().filter(|m| !m.is_empty()) {
        let _ = writeln!(
            out,
            "<tr class=\"message\"><td colspan=\"{}\">{}</td></tr>",
            RUN_COLUMNS.len(),
            escape(message)
        );
    }
    out.push_str(&error_row(e));
    out
}

/// The error of a record with its place (the flow and the dataset), if it has one.
fn error_row(e: &LoggedEvent) -> String {
    let Some(error) = &e.error else {
        return String::new();
    };
    let place = match (e.flow.is_empty(), e.dataset.is_empty()) {
        (false, false) => format!("{} → {}: ", e.flow, e.dataset),
        (false, true) => format!("{}: ", e.flow),
        (true, false) => format!("{}: ", e.dataset),
        (true, true) => String::new(),
    };
    format!(
        "<tr class=\"error\" data-dataset=\"{}\"><td colspan=\"{}\"><pre>error at {}{}</pre></td></tr>\n",
        escape(&e.dataset),
        RUN_COLUMNS.len(),
        escape(&place),
        escape(error)
    )
}

/// A grid as a table with class `class`, each value cut at `max_chars` (the whole value
/// in its cell's tooltip).
fn grid_table(class: &str, g: &Grid, max_chars: usize) -> String {
    let mut out = format!("<table class=\"{class}\">\n<thead><tr>");
    for c in &g.columns {
        let _ = write!(out, "<th>{}</th>", escape(c));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in &g.rows {
        out.push_str("<tr>");
        for v in row {
            if v.chars().nth(max_chars).is_some() {
                let _ = write!(
                    out,
                    "<td title=\"{}\">{}</td>",
                    escape(v),
                    escape(&cut(v, max_chars))
                );
            } else {
                let _ = write!(out, "<td>{}</td>", escape(v));
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    out
}

/// How much of a value a table's page shows in a cell (all of it in the tooltip).
const CELL_CHARS: usize = 200;
/// A commit's parameters and metrics can be long (a CREATE TABLE's whole schema).
const HISTORY_CELL_CHARS: usize = 160;

/// A table's page.
pub fn table_page(t: &TablePage) -> String {
    let body = format!(
        "<h1>Table <code id=\"table-name\">{}</code></h1>\n\
         <p id=\"row-count\" data-rows=\"{}\">{} rows</p>\n\
         <h2>Schema</h2>\n{}\
         <h2>Recent history (newest first)</h2>\n{}\
         <h2>Sample rows (at most {})</h2>\n{}",
        escape(&t.name),
        t.row_count,
        t.row_count,
        grid_table("schema", &t.columns, CELL_CHARS),
        grid_table("history", &t.history, HISTORY_CELL_CHARS),
        super::model::SAMPLE_ROWS,
        grid_table("sample", &t.sample, CELL_CHARS),
    );
    page(&format!("strata: {}", t.name), "", &body)
}

/// A page saying what went wrong (404, 500).
pub fn error_page(title: &str, message: &str) -> String {
    page(
        &format!("strata: {title}"),
        "",
        &format!(
            "<h1>{}</h1>\n<p class=\"error-message\">{}</p>\n<p><a href=\"/\">The warehouse</a></p>\n",
            escape(title),
            escape(message)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::super::model::{EdgeView, Grid};
    use super::*;

    #[test]
    fn every_special_character_is_escaped() {
        assert_eq!(
            escape("<script>alert('x') & \"y\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
    }

    #[test]
    fn table_links_encode_what_a_path_cannot_hold() {
        assert_eq!(table_href("default.users"), "/tables/default.users");
        assert_eq!(table_href("a b/c?"), "/tables/a%20b%2Fc%3F");
        assert_eq!(table_href("é"), "/tables/%C3%A9");
    }

    #[test]
    fn names_from_the_warehouse_cannot_open_tags() {
        let evil = "<img src=x onerror=alert(1)>";
        let g = GraphView {
            nodes: vec![NodeView {
                name: evil.into(),
                detail: evil.into(),
                written: true,
                is_table: true,
                status: Some("COMPLETED".into()),
                x: 0,
                y: 0,
            }],
            edges: vec![EdgeView {
                from: evil.into(),
                to: evil.into(),
                step: evil.into(),
            }],
            width: 10,
            height: 10,
        };
        let svg = graph_svg(&g);
        assert!(!svg.contains("<img"), "{svg}");
        let run = RunView {
            run_id: evil.into(),
            started: evil.into(),
            status: "FAILED".into(),
            datasets: vec![LoggedEvent {
                dataset: evil.into(),
                flow: evil.into(),
                error: Some(evil.into()),
                message: Some(evil.into()),
                ..LoggedEvent::default()
            }],
            run_records: vec![],
        };
        let html = runs_table(&[run]);
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("error at &lt;img"), "{html}");
        let t = table_page(&TablePage {
            name: evil.into(),
            columns: Grid {
                columns: vec![evil.into()],
                rows: vec![vec![evil.into()]],
            },
            row_count: 1,
            history: Grid::default(),
            sample: Grid::default(),
        });
        assert!(!t.contains("<img"), "{t}");
    }

    #[test]
    fn long_cells_are_cut_with_the_whole_value_in_the_tooltip() {
        let g = Grid {
            columns: vec!["v".into()],
            rows: vec![vec!["abcdef".into()], vec!["ab".into()]],
        };
        let html = grid_table("history", &g, 3);
        assert!(html.contains("<td title=\"abcdef\">abc…</td>"), "{html}");
        assert!(html.contains("<td>ab</td>"), "{html}");
    }

    #[test]
    fn long_labels_are_cut_on_a_character() {
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("ééé", 2), "éé…");
        assert_eq!(cut("ab", 3), "ab");
    }
}
