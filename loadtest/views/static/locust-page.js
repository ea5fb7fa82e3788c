// Locust's own page follows the runs (inlined into its index page by loadtest/views/webui.py).
//
// Locust's page polls /stats/requests every 2 s, and only while its store says a run is spawning or
// running (its useInterval's shouldRunInterval). So a poll answered "stopping" (the master waits for its
// workers' users to stop) ended its polling: the page stayed at STOPPING until reloaded. A run started
// from the panel never reached a page showing its form or STOPPED. And a new start kept the last poll's
// rows, the previous run's, on the "OCR plan" tab until the first poll 2 s later.
// Here: while Locust's page does not poll, this script asks /stats/requests itself every 2 s, and when the
// state, the worker count or the tab's rows (keyed by the run id) differ from what the page last got, it
// has the page poll now, through Locust's own store (RTK Query's invalidateTags on the "stats" tag: what
// its Reset does), so the page's own code takes the answer in. A start from the page clears the tab's rows at once. A start
// the server refuses (409: one run at a time) shows its reason in Locust's form, which reads only a 200.
(() => {
  const TAB_KEY = "__TAB_KEY__";
  const POLLED = ["spawning", "running"];  // the states in which Locust's page polls by itself
  const FOLLOW_MS = 2000;  // as often as Locust's own poll
  const ownFetch = window.fetch.bind(window);
  const statsUrl = new URL("stats/requests", document.baseURI).pathname;
  const swarmUrl = new URL("swarm", document.baseURI).pathname;
  let got = null;  // what the page's last poll got: state, workers, run id, the tab's rows

  // the worker count too: a worker leaves Locust's count while it stops and rejoins after; a page whose last
  // poll read 0 kept its form's Start disabled ("before at least one worker ... has connected")
  const seen = (data) => JSON.stringify([data.state, data.worker_count ?? null, data.ocr_run_id ?? null,
    data.extended_stats ?? []]);

  const store = () => {  // Locust's Redux store, the prop of the Provider at the top of its React tree
    const root = document.getElementById("root");
    const key = root && Object.keys(root).find((k) => k.startsWith("__reactContainer$"));
    let fiber = key ? root[key] : null;
    for (let depth = 0; fiber && depth < 30; depth += 1, fiber = fiber.child) {
      const candidate = fiber.memoizedProps && fiber.memoizedProps.store;
      if (candidate && candidate.dispatch && candidate.getState) return candidate;
    }
    return null;
  };
  const pollNow = (redux) => redux.dispatch({type: "api/invalidateTags", payload: ["stats"]});

  window.fetch = async (input, init) => {
    const request = input instanceof Request ? input : null;
    const path = new URL(request ? request.url : String(input), document.baseURI).pathname;
    const method = ((init && init.method) || (request && request.method) || "GET").toUpperCase();
    const answer = await ownFetch(input, init);
    if (path === statsUrl) {
      answer.clone().json().then((data) => { got = seen(data); note(data); }, () => {});
    } else if (path === swarmUrl && method === "POST") {
      if (answer.status === 409) {  // refused, with why: Locust's form shows its message from a 200 only
        const why = await answer.clone().json().catch(() => ({success: false, message: "refused"}));
        return new Response(JSON.stringify(why), {status: 200, headers: {"Content-Type": "application/json"}});
      }
      const redux = answer.ok ? store() : null;
      if (redux) {  // a new run: none of the last run's rows until its first poll
        redux.dispatch({type: "ui/setUi", payload: {extendedStats: [{key: TAB_KEY, data: []}]}});
        got = null;
      }
    }
    return answer;
  };

  // beside Locust's Failures: the verify window's errors are provoked on purpose (webui.failures_note)
  const note = (data) => {
    const box = document.getElementById("ocr-failures-note");
    if (!box) return;
    box.textContent = data.ocr_failures_note || "";
    box.hidden = !data.ocr_failures_note;
  };

  const follow = async () => {
    const redux = store();
    const shown = redux && redux.getState().swarm && redux.getState().swarm.state;
    if (!redux || POLLED.includes(shown)) return;  // the page polls by itself now
    let data;
    try {
      data = await (await ownFetch(statsUrl, {cache: "no-store"})).json();
      note(data);
    } catch (error) {
      return;  // the master is gone, or busy: ask again at the next turn
    }
    // "ready" after a run: a start is under way (its first tick to come); the next turn sees it run
    if (data.state === "ready" && shown !== "ready") return;
    if (seen(data) !== got) pollNow(redux);
  };
  setInterval(follow, FOLLOW_MS);
})();
