// strata serve --http: the page's only script (embedded in the binary). It shows times in
// the reader's time zone, and on the overview checks every few seconds whether the event
// log has new records (a run in progress appends one as each dataset finishes): then it
// reloads the page.
"use strict";
(function () {
  const root = document.documentElement;
  for (const t of document.querySelectorAll("time[datetime]")) {
    const d = new Date(t.getAttribute("datetime"));
    if (!isNaN(d)) {
      t.title = t.getAttribute("datetime");
      t.textContent = d.toLocaleString();
    }
  }
  // How many times this tab reloaded the page for new records (shown on <html>).
  const reloads = Number(sessionStorage.getItem("strata-reloads") || 0);
  root.dataset.reloads = String(reloads);
  root.dataset.js = "ready";
  const shown = root.dataset.eventLogVersion;
  const live = document.getElementById("live");
  if (shown === undefined) return;
  const every = 3000;
  if (live) live.textContent = "live: checking for new runs every " + every / 1000 + " s";
  async function check() {
    try {
      const r = await fetch("/api/status", { cache: "no-store" });
      if (r.ok) {
        const s = await r.json();
        const now = s.event_log_version === null ? "none" : String(s.event_log_version);
        if (now !== shown) {
          if (live) live.textContent = "new records: reloading";
          sessionStorage.setItem("strata-reloads", String(reloads + 1));
          location.reload();
          return;
        }
      } else if (live) {
        live.textContent = "cannot check for new runs (HTTP " + r.status + ")";
      }
    } catch (e) {
      if (live) live.textContent = "cannot reach the server";
    }
    setTimeout(check, every);
  }
  setTimeout(check, every);
})();
