// fleetgen live dashboard: poll /api/state and swap the server-rendered fragments in place.
// No framework, no chart library: the server renders every table and SVG chart.
"use strict";
(function () {
  const POLL_MS = 1500;
  let polls = 0;
  let failures = 0;

  function apply(state) {
    for (const [id, text] of Object.entries(state.numbers)) {
      const el = document.getElementById(id);
      if (el) el.textContent = text;
    }
    for (const [id, html] of Object.entries(state.fragments)) {
      const el = document.getElementById(id);
      if (el && el.innerHTML !== html) el.innerHTML = html;
    }
    for (const [card, isBad] of Object.entries(state.warn || {})) {
      const el = document.querySelector('[data-card="' + card + '"]');
      if (el) el.classList.toggle("warn", isBad);
    }
    document.title = state.title;
  }

  function setLive(text, isStale) {
    const el = document.getElementById("live");
    el.textContent = text;
    el.classList.toggle("stale", isStale);
  }

  async function poll() {
    try {
      const resp = await fetch("api/state", { cache: "no-store" });
      if (!resp.ok) throw new Error("HTTP " + resp.status + ": " + (await resp.text()).slice(0, 200));
      apply(await resp.json());
      polls += 1;
      failures = 0;
      document.body.dataset.polls = String(polls);
      setLive("live · updated " + new Date().toLocaleTimeString(), false);
    } catch (err) {
      failures += 1;
      setLive("NOT UPDATING (" + failures + " failed polls): " + err.message, true);
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  poll();
})();
