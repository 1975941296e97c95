"""The view's one stylesheet and one script, served as they are: no build step.

The script polls the page's live part (``data-live``: the same page's HTML fragment)
every ``data-every`` ms and swaps it in when it changed; it pauses while the tab is
hidden and says when the server stops answering. It builds no markup itself, so
everything on the page is escaped in one place, on the server.
"""

SCRIPT = r"""
(function () {
  "use strict";
  var main = document.querySelector("[data-live]");
  var live = document.getElementById("live");
  if (!main || !live) { return; }
  // absolute, and without the user:password@ a page opened that way carries (fetch
  // refuses such URLs; the browser sends the credentials it holds for this site)
  var target = new URL(main.getAttribute("data-live"), window.location.href);
  target.username = "";
  target.password = "";
  var url = target.href;
  var every = parseInt(main.getAttribute("data-every"), 10) || 2000;
  var status = document.createElement("p");
  status.id = "live-status";
  status.className = "live-status";
  main.insertBefore(status, live);
  var busy = false;
  function poll() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(url, {credentials: "same-origin", cache: "no-store",
                headers: {"Accept": "text/html"}})
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (text) {
        if (text !== live.innerHTML) { live.innerHTML = text; }
        status.textContent = "live: updated " + new Date().toLocaleTimeString();
        status.classList.remove("stale");
      })
      .catch(function (error) {
        status.textContent = "not updating: " + error.message + " (retrying)";
        status.classList.add("stale");
      })
      .then(function () { busy = false; });
  }
  setInterval(poll, every);
  document.addEventListener("visibilitychange", poll);
})();
"""

#: the standalone page's frame (the Django admin has its own)
FRAME_STYLE = """
:root { color-scheme: light dark; }
body { font: 14px/1.45 system-ui, sans-serif; margin: 0; }
header { display: flex; justify-content: space-between; padding: .6em 1.2em;
         border-bottom: 1px solid #8884; }
header nav a { margin-right: 1.2em; font-weight: 600; }
.mode { color: var(--dim); }
main { padding: 0 1.2em 2em; }
"""

#: the view's own parts, in both
STYLE = """
:root { --ok: #1a7f37; --bad: #cf222e; --dim: #6e7781; }
table { border-collapse: collapse; margin: .5em 0 1em; }
th, td { text-align: left; padding: .25em .8em .25em 0; border-bottom: 1px solid #8883;
         vertical-align: top; }
th { font-weight: 600; }
.lead { font-size: 1.15em; }
.ok { color: var(--ok); } .bad { color: var(--bad); }
.role.gone, .state.missed, .state.unsent, .state.error { color: var(--bad); }
.role.leader, .state.sent { color: var(--ok); }
.paused { color: #9a6700; font-weight: 600; }
.live-status { color: var(--dim); font-size: .85em; }
.live-status.stale { color: var(--bad); }
.done { border-left: 4px solid var(--ok); padding: .3em .8em; }
.error { border-left: 4px solid var(--bad); padding: .3em .8em; }
form.action, form.filter { margin: .6em 0; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: .2em 1.2em; }
dl.facts dt { font-weight: 600; }
.hint { color: var(--dim); }
.pager a { margin-right: 1em; }
"""
