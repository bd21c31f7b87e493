// The eventstore inspector (docs/inspector.md): a plain script, no build
// step, no framework, nothing loaded from elsewhere. It talks to the
// server's JSON API with the bearer token the user gives it.
//
// Two rules hold everywhere below:
// - Data from the store is only ever put into the page as text
//   (textContent, createTextNode, attribute values through setAttribute):
//   never innerHTML, so a payload or a session name cannot become markup.
// - Numbers are kept exact: the API sends int64 and floats in their
//   canonical text, and JSON.parse would round 9007199254740993 or turn
//   3.0 into 3. parseJSON keeps a number that does not read back to the
//   same text as a Raw holding that text, and pretty prints it verbatim.
'use strict';

(function () {
  // ---- exact JSON ---------------------------------------------------------

  // A number that a JS double cannot carry as written (int64 beyond 2^53,
  // 3.0, -0); its text is the wire's own.
  class Raw {
    constructor(text) { this.text = text; }
    toString() { return this.text; }
  }

  // Objects keep their keys in wire order here (a JS object would move
  // integer-like keys such as "10" first).
  const KEYS = Symbol('keys');
  const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;

  function parseJSON(text) {
    let i = 0;
    const fail = (what) => { throw new SyntaxError('bad JSON at ' + i + ': ' + what); };
    const ws = () => {
      while (i < text.length) {
        const c = text.charCodeAt(i);
        if (c !== 32 && c !== 9 && c !== 10 && c !== 13) break;
        i++;
      }
    };
    const str = () => {
      if (text[i] !== '"') fail('expected a string');
      let j = i + 1;
      while (j < text.length && text[j] !== '"') j += text[j] === '\\' ? 2 : 1;
      if (j >= text.length) fail('unterminated string');
      const s = JSON.parse(text.slice(i, j + 1));
      i = j + 1;
      return s;
    };
    const value = () => {
      ws();
      const c = text[i];
      if (c === '{') {
        i++;
        // No prototype: a "__proto__" key is an ordinary key here.
        const o = Object.create(null);
        const keys = [];
        ws();
        if (text[i] === '}') { i++; o[KEYS] = keys; return o; }
        for (;;) {
          ws();
          const k = str();
          ws();
          if (text[i] !== ':') fail('expected :');
          i++;
          const v = value();
          if (!(k in o)) keys.push(k);
          o[k] = v;
          ws();
          if (text[i] === ',') { i++; continue; }
          if (text[i] !== '}') fail('expected , or }');
          i++;
          o[KEYS] = keys;
          return o;
        }
      }
      if (c === '[') {
        i++;
        const a = [];
        ws();
        if (text[i] === ']') { i++; return a; }
        for (;;) {
          a.push(value());
          ws();
          if (text[i] === ',') { i++; continue; }
          if (text[i] !== ']') fail('expected , or ]');
          i++;
          return a;
        }
      }
      if (c === '"') return str();
      if (text.startsWith('true', i)) { i += 4; return true; }
      if (text.startsWith('false', i)) { i += 5; return false; }
      if (text.startsWith('null', i)) { i += 4; return null; }
      NUMBER.lastIndex = i;
      const m = NUMBER.exec(text);
      if (!m) fail('unexpected ' + JSON.stringify(text.slice(i, i + 10)));
      i = NUMBER.lastIndex;
      const n = Number(m[0]);
      return String(n) === m[0] ? n : new Raw(m[0]);
    };
    const v = value();
    ws();
    if (i !== text.length) fail('trailing text');
    return v;
  }

  function isObject(v) {
    return v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof Raw);
  }

  function keysOf(o) { return o[KEYS] || Object.keys(o); }

  function pretty(v, ind) {
    ind = ind || '';
    if (v === null || v === undefined) return 'null';
    if (v instanceof Raw) return v.text;
    if (typeof v === 'number' || typeof v === 'boolean') return String(v);
    if (typeof v === 'string') return JSON.stringify(v);
    const next = ind + '  ';
    if (Array.isArray(v)) {
      if (v.length === 0) return '[]';
      return '[\n' + v.map((x) => next + pretty(x, next)).join(',\n') + '\n' + ind + ']';
    }
    const keys = keysOf(v);
    if (keys.length === 0) return '{}';
    return '{\n' + keys.map((k) => next + JSON.stringify(k) + ': ' + pretty(v[k], next)).join(',\n') +
      '\n' + ind + '}';
  }

  // A JSON value in one line (for table cells).
  function compact(v) {
    if (v === null || v === undefined) return 'null';
    if (v instanceof Raw) return v.text;
    if (typeof v !== 'object') return typeof v === 'string' ? v : String(v);
    return pretty(v).replace(/\n\s*/g, ' ');
  }

  // ---- DOM helpers: text only ---------------------------------------------

  const $ = (id) => document.getElementById(id);

  // el('a', {class: 'x', 'data-index': 3, onclick: fn}, 'text', child...):
  // attributes through setAttribute, functions as listeners, children as
  // nodes or text nodes. Nothing is ever parsed as HTML.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (typeof v === 'function') e.addEventListener(k.replace(/^on/, ''), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null || c === false) continue;
      e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

  function fmtTime(ms) {
    if (ms === undefined || ms === null) return '';
    const n = Number(String(ms));
    if (!Number.isFinite(n)) return String(ms);
    const d = new Date(n);
    return isNaN(d.getTime()) ? String(ms) : d.toISOString().replace('T', ' ').replace('Z', ' UTC');
  }

  // A path segment: every name the user or the store gives goes through
  // encodeURIComponent, so '/', '?', '#', '%' and spaces stay in one segment.
  const seg = (s) => encodeURIComponent(String(s));

  function query(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
    }
    const s = q.toString();
    return s ? '?' + s : '';
  }

  // ---- errors -------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body, text) {
      const code = isObject(body) && typeof body.code === 'string' ? body.code : 'HTTP_' + status;
      const msg = isObject(body) && typeof body.message === 'string' ? body.message : (text || '').slice(0, 300);
      super(status + ' ' + code + (msg ? ': ' + msg : ''));
      this.status = status;
      this.code = code;
    }
  }

  function showError(e) {
    const text = e instanceof Error ? e.message : String(e);
    $('error-text').textContent = text;
    $('error').hidden = false;
    if (e instanceof ApiError && e.status === 401) askToken();
  }

  function clearError() {
    $('error').hidden = true;
    $('error-text').textContent = '';
  }

  // Runs an async action; its failure shows in the error banner.
  function guard(fn) {
    return (...args) => Promise.resolve().then(() => fn(...args)).catch(showError);
  }

  // ---- the token and the API ------------------------------------------------

  const TOKEN_KEY = 'eventstore.inspector.token';
  let token = sessionStorage.getItem(TOKEN_KEY) || '';

  function authHeaders(extra) {
    return Object.assign({ Authorization: 'Bearer ' + token }, extra || {});
  }

  async function api(method, path, body) {
    const init = { method, headers: authHeaders({ Accept: 'application/json' }), cache: 'no-store' };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    const text = await r.text();
    let data = null;
    if (text !== '') {
      try { data = parseJSON(text); } catch (_) { data = null; }
    }
    if (!r.ok) throw new ApiError(r.status, data, text);
    return data;
  }

  function askToken() {
    $('login').hidden = false;
    $('token-input').focus();
  }

  function setToken(t) {
    token = t;
    if (t) sessionStorage.setItem(TOKEN_KEY, t);
    else sessionStorage.removeItem(TOKEN_KEY);
    $('token-status').textContent = t ? 'token set' : 'no token';
    $('sign-out').hidden = !t;
    $('login').hidden = !!t;
    $('app').hidden = !t;
  }

  // ---- live streams: SSE over fetch -------------------------------------------

  // EventSource cannot send an Authorization header, so streams are read
  // with fetch and parsed here (the text/event-stream format: "id:",
  // "event:", "data:" lines, a blank line ends an event, ":" a comment).
  // On an error or an end, it reconnects with Last-Event-ID set to the
  // last id seen, waiting 0.5 s, then twice as long each time up to 10 s
  // (reset once an event arrives). 401, 403 and 404 stop it: retrying
  // cannot help. Returns {stop()}.
  function openStream(path, opts) {
    const ctl = { stopped: false, abort: null, lastId: opts.lastId };
    const setStatus = opts.status || (() => {});
    const sleep = (ms) => new Promise((res) => setTimeout(res, ms));
    (async () => {
      let backoff = 500;
      while (!ctl.stopped) {
        const ac = new AbortController();
        ctl.abort = ac;
        try {
          const headers = authHeaders({ Accept: 'text/event-stream' });
          if (ctl.lastId !== undefined && ctl.lastId !== null) headers['Last-Event-ID'] = String(ctl.lastId);
          setStatus('connecting');
          const r = await fetch(path, { headers, signal: ac.signal, cache: 'no-store' });
          if (!r.ok) {
            const text = await r.text();
            let data = null;
            try { data = parseJSON(text); } catch (_) { /* not JSON */ }
            const err = new ApiError(r.status, data, text);
            if (r.status === 401 || r.status === 403 || r.status === 404) {
              setStatus('stopped');
              showError(err);
              return;
            }
            throw err;
          }
          setStatus('live');
          const reader = r.body.getReader();
          const decoder = new TextDecoder();
          let buf = '';
          let ev = { id: undefined, event: '', data: [] };
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += decoder.decode(value, { stream: true });
            // A lone '\r' at the end may be the first half of "\r\n".
            let m;
            const lineRe = /\r\n|\r(?!$)|\n/g;
            let start = 0;
            while ((m = lineRe.exec(buf)) !== null) {
              const line = buf.slice(start, m.index);
              start = lineRe.lastIndex;
              if (line === '') {
                if (ev.id !== undefined) ctl.lastId = ev.id;
                if (ev.data.length > 0) {
                  const text = ev.data.join('\n');
                  let data = text;
                  try { data = parseJSON(text); } catch (_) { /* plain text data */ }
                  backoff = 500;
                  try { opts.onEvent({ id: ev.id, event: ev.event || 'message', data }); } catch (e) { showError(e); }
                }
                ev = { id: undefined, event: '', data: [] };
                continue;
              }
              if (line[0] === ':') continue;
              const colon = line.indexOf(':');
              const field = colon < 0 ? line : line.slice(0, colon);
              let val = colon < 0 ? '' : line.slice(colon + 1);
              if (val[0] === ' ') val = val.slice(1);
              if (field === 'data') ev.data.push(val);
              else if (field === 'event') ev.event = val;
              else if (field === 'id' && val.indexOf('\0') < 0) ev.id = val;
            }
            buf = buf.slice(start);
          }
        } catch (e) {
          if (ctl.stopped) return;
          if (!(e instanceof DOMException && e.name === 'AbortError')) console.warn('stream', path, e);
        }
        if (ctl.stopped) return;
        setStatus('reconnecting');
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 10000);
      }
    })();
    ctl.stop = () => {
      ctl.stopped = true;
      if (ctl.abort) ctl.abort.abort();
      setStatus('off');
    };
    return ctl;
  }

  // An `event: error` of a stream ({code, message}; the server ends the
  // stream after it and the reader reconnects).
  function streamError(data) {
    const code = isObject(data) && typeof data.code === 'string' ? data.code : 'STREAM';
    const msg = isObject(data) && typeof data.message === 'string' ? data.message : String(data);
    return new Error('live stream: ' + code + ': ' + msg);
  }

  function setBadge(node, state) {
    node.textContent = state;
    node.setAttribute('data-state', state);
  }

  // ---- events ---------------------------------------------------------------

  // The responses' lists: the API's names, with the first array found as a
  // fallback so a renamed key does not blank the page.
  function listOf(body, name) {
    if (Array.isArray(body)) return body;
    if (!isObject(body)) return [];
    if (Array.isArray(body[name])) return body[name];
    for (const k of keysOf(body)) if (Array.isArray(body[k])) return body[k];
    return [];
  }

  function sessionLink(name, index) {
    const href = '#/sessions/' + seg(name) + (index !== undefined && index !== null ? '/' + seg(index) : '');
    return el('a', { href, class: 'session-link', 'data-test': 'session-link', 'data-session': name }, name);
  }

  // One event as a list item. `where`: 'session' (cause links jump within
  // the page) or 'list' (dead letters, live feed: the session is named).
  function eventItem(ev, where) {
    const idx = ev.index !== undefined ? String(ev.index) : '';
    const status = typeof ev.status === 'string' ? ev.status : '';
    const li = el('li', {
      class: 'event status-' + status.replace(/[^a-z_]/g, ''),
      'data-test': where === 'session' ? 'event-row' : (where === 'dead' ? 'dead-row' : 'feed-row'),
      'data-index': idx,
      'data-session': ev.session,
      'data-position': ev.position !== undefined ? String(ev.position) : undefined,
      'data-status': status,
      id: where === 'session' ? 'event-' + idx : undefined,
    });
    const head = el('div', { class: 'event-head' },
      el('span', { class: 'index', 'data-test': 'event-index' }, '#' + idx),
      el('span', { class: 'type', 'data-test': 'event-type' }, ev.type !== undefined ? String(ev.type) : ''),
      el('span', { class: 'badge status', 'data-test': 'event-status', 'data-state': status }, status));
    if (where !== 'session' && ev.session !== undefined) head.appendChild(sessionLink(String(ev.session), ev.index));
    if (ev.lane !== undefined) head.appendChild(el('span', { class: 'lane', title: 'lane' }, 'lane ' + ev.lane));
    if (ev.attempts !== undefined) head.appendChild(el('span', { class: 'meta', 'data-test': 'event-attempts' }, 'attempts ' + ev.attempts));
    if (ev.failures !== undefined && String(ev.failures) !== '0') head.appendChild(el('span', { class: 'meta' }, 'failures ' + ev.failures));
    head.appendChild(el('span', { class: 'time', title: 'created_at ' + ev.created_at }, fmtTime(ev.created_at)));
    li.appendChild(head);

    const meta = el('div', { class: 'event-meta' });
    meta.appendChild(el('span', { class: 'id', 'data-test': 'event-id' }, 'id ' + ev.id));
    if (ev.position !== undefined) meta.appendChild(el('span', { class: 'meta' }, 'position ' + ev.position));
    if (isObject(ev.cause)) {
      const ci = String(ev.cause.index);
      const link = el('a', {
        href: '#/sessions/' + seg(ev.session) + '/' + seg(ci),
        class: 'cause-link', 'data-test': 'cause-link', 'data-cause-index': ci,
      }, 'cause #' + ci + ' (attempt ' + ev.cause.attempt + ')');
      if (where === 'session') {
        link.addEventListener('click', (e) => {
          e.preventDefault();
          guard(jumpTo)(Number(ci));
        });
      }
      meta.appendChild(link);
    }
    if (isObject(ev.origin)) {
      meta.appendChild(el('a', {
        href: '#/sessions/' + seg(ev.origin.session) + '/' + seg(ev.origin.index),
        class: 'origin-link', 'data-test': 'origin-link',
        'data-origin-session': ev.origin.session, 'data-origin-index': String(ev.origin.index),
      }, 'forked from ' + ev.origin.session + ' #' + ev.origin.index));
    }
    if (ev.not_before !== undefined) meta.appendChild(el('span', { class: 'meta' }, 'not before ' + fmtTime(ev.not_before)));
    if (ev.retry_at !== undefined) meta.appendChild(el('span', { class: 'meta' }, 'retry at ' + fmtTime(ev.retry_at)));
    if (ev.claim_holder !== undefined) {
      meta.appendChild(el('span', { class: 'meta' }, 'claimed by ' + ev.claim_holder + ' until ' + fmtTime(ev.claim_expires_at)));
    }
    if (ev.processed_at !== undefined) meta.appendChild(el('span', { class: 'meta' }, 'processed ' + fmtTime(ev.processed_at)));
    if (ev.cancelled !== undefined) meta.appendChild(el('span', { class: 'meta', 'data-test': 'event-cancelled' }, 'cancelled: ' + ev.cancelled));
    if (ev.key !== undefined) meta.appendChild(el('span', { class: 'meta' }, 'key ' + ev.key));
    li.appendChild(meta);

    if (ev.last_error !== undefined && ev.last_error !== null) {
      li.appendChild(el('div', { class: 'last-error', 'data-test': 'event-error' }, 'last error: ' + ev.last_error));
    }
    if (ev.shredded === true) {
      li.appendChild(el('div', { class: 'muted' }, 'payload shredded'));
    } else {
      li.appendChild(el('pre', { class: 'payload', 'data-test': 'event-payload' }, pretty(ev.payload)));
    }
    return li;
  }

  // ---- the sessions view -----------------------------------------------------

  const PAGE = 100;
  const S = {
    prefix: '', cursor: null,        // sessions list
    name: null,                      // the open session
    lastPaged: 0, through: null,     // events paged in so far; the head pinned at open
    live: null,                      // the open session's stream
    gen: 0,                          // bumps on every open: late answers of an older open are dropped
  };

  async function loadSessions(more) {
    if (!more) { S.cursor = null; clear($('sessions')); }
    const body = await api('GET', '/v1/sessions' + query({ prefix: S.prefix, after: more ? S.cursor : null, limit: PAGE }));
    const rows = listOf(body, 'sessions');
    for (const row of rows) {
      const name = String(row.session);
      const li = el('li', { 'data-test': 'session-row', 'data-session': name, class: name === S.name ? 'current' : undefined },
        el('a', { href: '#/sessions/' + seg(name), class: 'session-link' }, name),
        el('span', { class: 'counts' },
          row.events + ' ev' + (row.pending && String(row.pending) !== '0' ? ', ' + row.pending + ' pending' : '') +
          (row.dead && String(row.dead) !== '0' ? ', ' + row.dead + ' dead' : '') + (row.sealed ? ', sealed' : '')));
      $('sessions').appendChild(li);
    }
    S.cursor = isObject(body) && body.cursor !== undefined && body.cursor !== null ? String(body.cursor) : null;
    $('sessions-more').hidden = S.cursor === null;
    $('sessions-empty').hidden = $('sessions').children.length > 0;
  }

  function closeSession() {
    if (S.live) { S.live.stop(); S.live = null; }
    S.name = null;
  }

  // Rows are kept in index order whatever order they arrive in (pages,
  // then live events; a refreshed row replaces its old self).
  function putRow(ev) {
    const list = $('events');
    const idx = Number(String(ev.index));
    const row = eventItem(ev, 'session');
    // A pending timer (not_before set) can be called off (§3.2 cancel, right
    // `work`): it becomes processed without being handled.
    if (ev.status === 'pending' && ev.not_before !== undefined) {
      const name = S.name;
      row.appendChild(el('div', { class: 'actions' },
        el('button', {
          type: 'button', 'data-test': 'cancel', class: 'cancel',
          onclick: guard(async () => {
            await api('POST', '/v1/sessions/' + seg(name) + '/events/' + seg(ev.index) + '/cancel',
              { reason: 'cancelled from the inspector' });
            if (name === S.name) await refreshEvent(idx);
          }),
        }, 'Cancel')));
    }
    const old = list.querySelector('li[data-test="event-row"][data-index="' + CSS.escape(String(ev.index)) + '"]');
    if (old) {
      if (old.classList.contains('highlight')) row.classList.add('highlight');
      list.replaceChild(row, old);
      return row;
    }
    let before = null;
    for (let n = list.lastElementChild; n; n = n.previousElementSibling) {
      if (Number(n.getAttribute('data-index')) > idx) before = n;
      else break;
    }
    list.insertBefore(row, before);
    return row;
  }

  function summarize() {
    const n = $('events').children.length;
    const through = S.through !== null ? S.through : 0;
    let text = n + ' event' + (n === 1 ? '' : 's') + ' shown';
    if (S.lastPaged < through) text += '; history loaded through #' + S.lastPaged + ' of #' + through;
    $('events-summary').textContent = text;
    $('events-more').hidden = !(S.lastPaged < through);
  }

  // A page the server ended early at its max_response_bytes (docs/http-api.md):
  // shorter than asked, and not the end.
  function capped(body) { return isObject(body) && body.capped === true; }

  async function loadEventsPage() {
    const gen = S.gen;
    const name = S.name;
    const body = await api('GET', '/v1/sessions/' + seg(name) + '/events' +
      query({ after: S.lastPaged, limit: PAGE, through: S.through }));
    if (gen !== S.gen) return;
    const evs = listOf(body, 'events');
    for (const ev of evs) {
      putRow(ev);
      const i = Number(String(ev.index));
      if (i > S.lastPaged) S.lastPaged = i;
    }
    if (S.through === null) {
      S.through = isObject(body) && body.through !== undefined && body.through !== null
        ? Number(String(body.through)) : S.lastPaged;
    }
    // A short page is the end, whatever `through` says, unless the server
    // cut it at its max_response_bytes (capped: read on from its last event).
    if (evs.length < PAGE && !capped(body) && S.lastPaged < S.through) S.through = S.lastPaged;
    summarize();
  }

  // Re-reads one event (its status changed: a consequence arrived).
  async function refreshEvent(index) {
    const gen = S.gen;
    const body = await api('GET', '/v1/sessions/' + seg(S.name) + '/events' + query({ after: index - 1, limit: 1 }));
    if (gen !== S.gen) return;
    const ev = listOf(body, 'events')[0];
    if (ev && Number(String(ev.index)) === index &&
        $('events').querySelector('li[data-test="event-row"][data-index="' + index + '"]')) putRow(ev);
  }

  function startLive() {
    if (S.live) { S.live.stop(); S.live = null; }
    if (!$('live-toggle').checked || S.name === null) { setBadge($('live-status'), 'off'); return; }
    const gen = S.gen;
    // From the head at open: the pages cover what came before.
    S.live = openStream('/v1/sessions/' + seg(S.name) + '/stream', {
      lastId: S.through !== null ? S.through : 0,
      status: (st) => { if (gen === S.gen) setBadge($('live-status'), st); },
      onEvent: (msg) => {
        if (gen !== S.gen) return;
        if (msg.event === 'error') { showError(streamError(msg.data)); return; }
        const ev = msg.data;
        if (!isObject(ev) || ev.index === undefined) return;
        const idx = Number(String(ev.index));
        // Older than the head at open: a page shows it (or will).
        if (S.through !== null && idx <= S.through && idx > S.lastPaged) return;
        const row = putRow(ev);
        row.classList.add('fresh');
        setTimeout(() => row.classList.remove('fresh'), 1500);
        if (isObject(ev.cause)) guard(refreshEvent)(Number(String(ev.cause.index)));
        summarize();
      },
    });
  }

  async function loadLineage() {
    const gen = S.gen;
    const box = $('lineage');
    clear(box);
    let parent = null;
    try {
      parent = await api('GET', '/v1/sessions/' + seg(S.name) + '/lineage');
    } catch (e) {
      if (!(e instanceof ApiError && e.status === 404)) throw e;
    }
    if (gen !== S.gen) return;
    const rec = isObject(parent) && isObject(parent.lineage) ? parent.lineage : parent;
    if (isObject(rec) && rec.parent !== undefined && rec.parent !== null) {
      box.appendChild(el('span', { 'data-test': 'lineage-parent' }, 'forked from ',
        sessionLink(String(rec.parent), rec.at), ' at #' + rec.at + ' ' + fmtTime(rec.created_at)));
    }
    const kids = await api('GET', '/v1/sessions/' + seg(S.name) + '/children' + query({ limit: PAGE }));
    if (gen !== S.gen) return;
    const list = listOf(kids, 'children');
    if (list.length > 0) {
      const span = el('span', { 'data-test': 'lineage-children' }, 'forks: ');
      list.forEach((c, n) => {
        if (n) span.appendChild(document.createTextNode(', '));
        span.appendChild(sessionLink(String(c.session)));
        span.appendChild(document.createTextNode(' (at #' + c.at + ')'));
      });
      box.appendChild(span);
    }
  }

  async function openSession(name, focusIndex) {
    if (name !== S.name) {
      closeSession();
      S.gen++;
      S.name = name;
      S.lastPaged = 0;
      S.through = null;
      clear($('events'));
      $('state-output').hidden = true;
      $('session-none').hidden = true;
      $('session-body').hidden = false;
      $('session-title').textContent = name;
      for (const li of $('sessions').children) li.classList.toggle('current', li.getAttribute('data-session') === name);
      await loadEventsPage();
      startLive();
      guard(loadLineage)();
    }
    if (focusIndex !== undefined) await jumpTo(focusIndex);
  }

  // Scrolls to event `index` of the open session and highlights it,
  // paging history in first when it is not loaded yet.
  async function jumpTo(index) {
    const gen = S.gen;
    const find = () => $('events').querySelector('li[data-test="event-row"][data-index="' + index + '"]');
    while (!find() && S.lastPaged < index && S.through !== null && S.lastPaged < S.through && gen === S.gen) {
      await loadEventsPage();
    }
    const row = find();
    if (!row) throw new Error('event #' + index + ' of ' + S.name + ' is not in this session');
    for (const h of $('events').querySelectorAll('.highlight')) h.classList.remove('highlight');
    row.classList.add('highlight');
    row.scrollIntoView({ block: 'center' });
  }

  async function showState(reducer) {
    const gen = S.gen;
    const body = await api('GET', '/v1/sessions/' + seg(S.name) + '/state/' + seg(reducer));
    if (gen !== S.gen) return;
    $('state-meta').textContent = 'reducer ' + reducer + ' at index ' + (isObject(body) ? body.index : '?');
    $('state-json').textContent = pretty(isObject(body) ? body.state : body);
    $('state-output').hidden = false;
  }

  // ---- dead letters ------------------------------------------------------------

  const D = { cursor: null };

  async function loadDead(more) {
    if (!more) { D.cursor = null; clear($('dead-letters')); }
    const body = await api('GET', '/v1/dead-letters' +
      query({ session: $('dead-session').value, after: more ? D.cursor : null, limit: PAGE }));
    const evs = listOf(body, 'events');
    for (const ev of evs) {
      const li = eventItem(ev, 'dead');
      const where = '/v1/sessions/' + seg(ev.session) + '/events/' + seg(ev.index);
      const act = (what, body2) => guard(async () => {
        await api('POST', where + '/' + what, body2);
        await loadDead(false);
      });
      li.appendChild(el('div', { class: 'actions' },
        el('button', { type: 'button', 'data-test': 'revive', class: 'revive', onclick: act('revive') }, 'Revive'),
        el('button', {
          type: 'button', 'data-test': 'settle', class: 'settle',
          onclick: () => act('settle', { reason: $('settle-reason').value || 'settled from the inspector' })(),
        }, 'Settle')));
      $('dead-letters').appendChild(li);
      if (ev.position !== undefined) D.cursor = String(ev.position);
    }
    const cursor = isObject(body) ? body.cursor : undefined;
    if (cursor !== undefined && cursor !== null) D.cursor = String(cursor);
    $('dead-more').hidden = evs.length < PAGE && !capped(body);
    $('dead-empty').hidden = $('dead-letters').children.length > 0;
  }

  // ---- refs -----------------------------------------------------------------------

  const R = { cursor: null };

  async function loadRefs(more) {
    if (!more) { R.cursor = null; clear($('refs')); }
    const body = await api('GET', '/v1/refs' + query({ after: more ? R.cursor : null, limit: PAGE }));
    const refs = listOf(body, 'refs');
    for (const ref of refs) {
      const name = String(ref.name);
      $('refs').appendChild(el('li', { 'data-test': 'ref-row', 'data-ref': name },
        el('a', { href: '#/refs/' + seg(name), class: 'ref-link' }, name),
        el('span', { class: 'counts' }, '-> ' + ref.session)));
      R.cursor = name;
    }
    const cursor = isObject(body) ? body.cursor : undefined;
    if (cursor !== undefined && cursor !== null) R.cursor = String(cursor);
    $('refs-more').hidden = (refs.length < PAGE && !capped(body)) ||
      (isObject(body) && 'cursor' in body && body.cursor === null);
    $('refs-empty').hidden = $('refs').children.length > 0;
  }

  async function showRef(name) {
    const box = $('ref-detail');
    const body = await api('GET', '/v1/refs/' + seg(name));
    const ref = isObject(body) && isObject(body.ref) ? body.ref : body;
    clear(box);
    box.appendChild(el('h2', {}, name));
    const dl = el('dl', { class: 'kv' });
    const add = (k, v) => { dl.appendChild(el('dt', {}, k)); dl.appendChild(el('dd', {}, v)); };
    add('session', sessionLink(String(ref.session)));
    add('head', ref.head !== undefined ? '#' + ref.head : '');
    add('created', fmtTime(ref.created_at));
    add('updated', fmtTime(ref.updated_at));
    box.appendChild(dl);
  }

  // ---- projections (§8) -------------------------------------------------------------
  // The list with status and lag; a projection's keys, paged by cursor; a
  // key's state as the live generation answers it.

  const J = { name: null, cursor: null, gen: 0 };

  async function loadProjections() {
    const body = await api('GET', '/v1/projections');
    const rows = listOf(body, 'projections');
    clear($('projections'));
    for (const r of rows) {
      const name = String(r.name);
      const err = r.status === 'failed'
        ? String(r.error || '') + ' (position ' + r.error_position + ', event ' + r.error_id + ')' : '';
      $('projections').appendChild(el('tr', { 'data-test': 'projection-row', 'data-projection': name },
        el('td', {}, el('a', { href: '#/projections/' + seg(name), class: 'projection-link' }, name)),
        el('td', { 'data-test': 'status' }, String(r.status) + (r.rebuilding ? ' (rebuilding)' : '')),
        el('td', {}, String(r.generation)),
        el('td', {}, String(r.position)),
        el('td', { 'data-test': 'lag' }, String(r.lag)),
        el('td', {}, String(r.lag_ms)),
        el('td', { class: 'error' }, err)));
    }
    $('projections-empty').hidden = rows.length > 0;
  }

  async function openProjection(name) {
    J.name = name;
    J.gen++;
    $('projection-name').textContent = name;
    $('projection-detail').hidden = false;
    $('projection-state').hidden = true;
    await loadKeys(false);
  }

  async function loadKeys(more) {
    const gen = J.gen;
    if (!more) { J.cursor = null; clear($('projection-keys')); }
    const body = await api('GET', '/v1/projections/' + seg(J.name) + '/keys' +
      query({ prefix: $('projection-prefix').value, after: more ? J.cursor : null, limit: PAGE }));
    if (gen !== J.gen) return;
    const keys = listOf(body, 'keys');
    for (const k of keys) {
      const key = String(k);
      $('projection-keys').appendChild(el('li', { 'data-test': 'key-row', 'data-key': key },
        el('button', { type: 'button', class: 'key-link', 'data-test': 'key-link', onclick: guard(() => showKey(key)) },
          key === '' ? '(the one state)' : key)));
    }
    J.cursor = isObject(body) && body.cursor !== undefined && body.cursor !== null ? String(body.cursor) : null;
    $('projection-keys-more').hidden = J.cursor === null;
    $('projection-keys-empty').hidden = $('projection-keys').children.length > 0;
  }

  async function showKey(key) {
    const gen = J.gen;
    const body = await api('GET', '/v1/projections/' + seg(J.name) + '/state/' + seg(key));
    if (gen !== J.gen) return;
    $('projection-state-meta').textContent = 'key ' + (key === '' ? '""' : key) + ': generation ' +
      body.generation + ' at position ' + body.position;
    $('projection-state-json').textContent = pretty(isObject(body) ? body.state : body);
    $('projection-state').hidden = false;
  }

  // ---- presence -------------------------------------------------------------------

  const P = { ns: null, live: null, timer: null };

  async function loadPresence() {
    const ns = P.ns;
    const body = await api('GET', '/v1/presence/' + seg(ns));
    if (ns !== P.ns) return;
    renderPresence(listOf(body, 'rows'));
  }

  function renderPresence(rows) {
    const tb = $('presence-rows');
    clear(tb);
    for (const r of rows) {
      tb.appendChild(el('tr', { 'data-test': 'presence-row', 'data-participant': r.participant },
        el('td', {}, String(r.participant)), el('td', {}, String(r.field)),
        el('td', {}, el('code', {}, compact(r.value))), el('td', {}, String(r.seen)),
        el('td', {}, String(r.at)), el('td', {}, fmtTime(r.expires_at))));
    }
    $('presence-empty').hidden = rows.length > 0;
  }

  function openPresence(ns) {
    if (P.live) { P.live.stop(); P.live = null; }
    P.ns = ns;
    $('presence-ns').value = ns;
    guard(loadPresence)();
    // A patch says what changed; the table is re-read (debounced) rather
    // than patched, so expiries and tombstones come out as the store says.
    P.live = openStream('/v1/presence/' + seg(ns) + '/stream', {
      status: (st) => setBadge($('presence-live'), st),
      onEvent: (msg) => {
        if (P.ns !== ns) return;
        if (msg.event === 'error') { showError(streamError(msg.data)); return; }
        // Every (re)connection starts with the whole namespace.
        if (msg.event === 'snapshot') { renderPresence(listOf(msg.data, 'rows')); return; }
        clearTimeout(P.timer);
        P.timer = setTimeout(guard(loadPresence), 200);
      },
    });
  }

  // ---- the all-sessions feed ------------------------------------------------------

  const F = { live: null, max: 500, gen: 0 };

  // The position of the newest event now. The API has no "last position"
  // call, and /v1/stream without Last-Event-ID replays every event from
  // the start, so it is searched with one-event reads: /v1/events?after=p
  // answers the first event after p (positions have gaps, so the answer's
  // own position is what moves the lower bound). About 2 * 63 reads at
  // worst, each one row.
  async function lastPosition() {
    const probe = async (p) => {
      const body = await api('GET', '/v1/events' + query({ after: String(p), limit: 1 }));
      const ev = listOf(body, 'events')[0];
      return ev && ev.position !== undefined ? BigInt(String(ev.position)) : null;
    };
    let lo = 0n;
    let hi = 1n;
    const MAX = (1n << 63n) - 1n;
    // Grow hi until nothing follows it; lo is always a position that exists
    // (or 0) and last >= lo.
    for (;;) {
      const q = await probe(hi);
      if (q === null) break;
      lo = q;
      if (hi >= MAX / 2n) { hi = MAX; break; }
      hi = hi * 2n > q ? hi * 2n : q + 1n;
    }
    // Nothing follows hi: last <= hi. Narrow until nothing follows lo.
    for (;;) {
      const first = await probe(lo);
      if (first === null) return lo;
      lo = first;
      if (lo >= hi) return lo;
      const mid = lo + (hi - lo) / 2n;
      const q = await probe(mid);
      if (q === null) hi = mid;
      else lo = q;
    }
  }

  // Where "now" is for the feed: {id (Last-Event-ID), text}. A shards:
  // store's events carry a read_all cursor (positions are per shard, so
  // there is no last position to search for): its last page's last cursor.
  async function feedStart() {
    const first = listOf(await api('GET', '/v1/events' + query({ limit: 1 })), 'events')[0];
    if (first === undefined) return { id: '0', text: 'from position 0' };
    if (typeof first.cursor === 'string') {
      let after = first.cursor;
      for (;;) {
        const evs = listOf(await api('GET', '/v1/events' + query({ after, limit: PAGE })), 'events');
        if (evs.length === 0) return { id: after, text: 'from cursor ' + after };
        after = String(evs[evs.length - 1].cursor);
      }
    }
    const from = await lastPosition();
    return { id: from.toString(), text: 'from position ' + from };
  }

  async function openFeed() {
    if (F.live) return;
    const gen = ++F.gen;
    setBadge($('feed-status'), 'connecting');
    const from = await feedStart();
    if (gen !== F.gen) return;
    $('feed-from').textContent = from.text;
    F.live = openStream('/v1/stream', {
      lastId: from.id,
      status: (st) => setBadge($('feed-status'), st),
      onEvent: (msg) => {
        if (msg.event === 'error') { showError(streamError(msg.data)); return; }
        if (!isObject(msg.data) || msg.data.index === undefined) return;
        const list = $('feed');
        list.appendChild(eventItem(msg.data, 'feed'));
        while (list.children.length > F.max) list.removeChild(list.firstElementChild);
      },
    });
  }

  function closeFeed() {
    F.gen++;
    if (F.live) { F.live.stop(); F.live = null; }
    setBadge($('feed-status'), 'off');
  }

  // ---- routing -------------------------------------------------------------------
  // #/sessions[/NAME[/INDEX]], #/dead, #/refs[/NAME], #/presence[/NS], #/projections[/NAME], #/feed

  // #token=TOKEN opens the inspector signed in (a link a script prints, a
  // headless browser's screenshot): a URL fragment never reaches the server,
  // so no access log keeps it. It is taken out of the address bar and the
  // history at once, and kept like a typed token (sessionStorage).
  function tokenFromHash() {
    const m = /^#token=([^&]*)/.exec(location.hash);
    if (!m) return false;
    let t = '';
    try { t = decodeURIComponent(m[1]).trim(); } catch (_) { t = ''; }
    history.replaceState(null, '', location.pathname + location.search);
    if (!t) return false;
    clearError();
    setToken(t);
    clear($('sessions'));
    return true;
  }

  function route() {
    tokenFromHash();
    if (!token) { askToken(); return; }
    const parts = location.hash.replace(/^#\/?/, '').split('/');
    const dec = (s) => { try { return decodeURIComponent(s); } catch (_) { return null; } };
    const view = ['sessions', 'dead', 'refs', 'presence', 'projections', 'feed'].includes(parts[0]) ? parts[0] : 'sessions';
    for (const v of document.querySelectorAll('section.view')) v.hidden = v.getAttribute('data-view') !== view;
    for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.getAttribute('data-view') === view);
    if (view !== 'feed') closeFeed();
    if (view !== 'presence' && P.live) { P.live.stop(); P.live = null; P.ns = null; }
    if (view === 'sessions') {
      if (!$('sessions').children.length) guard(loadSessions)(false);
      const name = parts.length > 1 ? dec(parts[1]) : null;
      const idx = parts.length > 2 ? Number(dec(parts[2])) : undefined;
      if (name !== null && name !== '') guard(openSession)(name, Number.isInteger(idx) ? idx : undefined);
    } else if (view === 'dead') {
      guard(loadDead)(false);
    } else if (view === 'refs') {
      guard(loadRefs)(false);
      const name = parts.length > 1 ? dec(parts[1]) : null;
      if (name) guard(showRef)(name);
    } else if (view === 'presence') {
      const ns = parts.length > 1 ? dec(parts[1]) : null;
      if (ns && ns !== P.ns) openPresence(ns);
    } else if (view === 'projections') {
      guard(loadProjections)();
      const name = parts.length > 1 ? dec(parts[1]) : null;
      if (name) guard(openProjection)(name);
      else $('projection-detail').hidden = true;
    } else if (view === 'feed') {
      guard(openFeed)();
    }
  }

  function start() {
    $('token-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const t = $('token-input').value.trim();
      if (!t) return;
      $('token-input').value = '';
      clearError();
      setToken(t);
      clear($('sessions'));
      route();
    });
    $('sign-out').addEventListener('click', () => {
      closeSession(); closeFeed();
      if (P.live) { P.live.stop(); P.live = null; P.ns = null; }
      clear($('sessions'));
      setToken('');
      askToken();
    });
    $('error-close').addEventListener('click', clearError);
    $('session-search').addEventListener('submit', (e) => {
      e.preventDefault();
      S.prefix = $('session-prefix').value;
      guard(loadSessions)(false);
    });
    $('sessions-more').addEventListener('click', guard(() => loadSessions(true)));
    $('session-open').addEventListener('submit', (e) => {
      e.preventDefault();
      const name = $('session-open-input').value;
      if (name) location.hash = '#/sessions/' + seg(name);
    });
    $('events-more').addEventListener('click', guard(loadEventsPage));
    $('events-refresh').addEventListener('click', () => {
      const name = S.name;
      if (name === null) return;
      closeSession();
      guard(openSession)(name);
    });
    $('live-toggle').addEventListener('change', startLive);
    $('state-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const r = $('reducer-input').value.trim();
      if (r && S.name !== null) guard(showState)(r);
    });
    $('dead-form').addEventListener('submit', (e) => { e.preventDefault(); guard(loadDead)(false); });
    $('dead-more').addEventListener('click', guard(() => loadDead(true)));
    $('refs-more').addEventListener('click', guard(() => loadRefs(true)));
    $('presence-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const ns = $('presence-ns').value;
      if (ns) {
        if (location.hash === '#/presence/' + seg(ns)) openPresence(ns);
        else location.hash = '#/presence/' + seg(ns);
      }
    });
    $('projection-keys-form').addEventListener('submit', (e) => { e.preventDefault(); guard(loadKeys)(false); });
    $('projection-keys-more').addEventListener('click', guard(() => loadKeys(true)));
    window.addEventListener('hashchange', route);
    setToken(token);
    route();
  }

  // For the browser test and the curious: the exact parser and printer.
  window.esInspector = { parseJSON, pretty, Raw };

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
