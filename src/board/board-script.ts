/**
 * The board's script, served as `assets/board.js` (no build step, no
 * framework). It builds every element with the DOM API and sets text with
 * `textContent`, never HTML, so nothing a key table holds can run as markup.
 * Kept as a string so the page ships inside the package's compiled output
 * and the sample's build alike; it contains no backtick and no `${`.
 */
export const BOARD_SCRIPT = String.raw`(function () {
  'use strict';

  function meta(name) {
    var element = document.querySelector('meta[name="' + name + '"]');
    return element ? element.getAttribute('content') || '' : '';
  }
  var base = meta('board-base');
  var csrf = meta('board-csrf');
  var scopedTenant = meta('board-tenant');
  // CHARTED_OUTCOMES (outcome-history.ts), in its order; a label says what the client was answered where it is known.
  var OUTCOMES = ['executed', 'takeover', 'replayed', 'failure-stored', 'kept', 'released', 'conflict', 'lease-lost',
    'mismatch', 'unavailable', 'error'];
  var OUTCOME_LABELS = {
    executed: 'executed', takeover: 'takeover', replayed: 'replayed', 'failure-stored': '4xx stored',
    kept: '5xx, key kept', released: 'failed, key released', conflict: '409 in flight', 'lease-lost': '409 lease lost',
    mismatch: '422 mismatch', unavailable: '503 unavailable', error: '500 module error'
  };

  function $(id) { return document.getElementById(id); }

  function el(tag, attributes, children) {
    var element = document.createElement(tag);
    Object.keys(attributes || {}).forEach(function (name) { element.setAttribute(name, attributes[name]); });
    (children || []).forEach(function (child) {
      element.appendChild(typeof child === 'string' || typeof child === 'number' ? document.createTextNode(String(child)) : child);
    });
    return element;
  }

  function clear(element) { while (element.firstChild) element.removeChild(element.firstChild); return element; }

  function api(path, body) {
    var init = body === undefined
      ? { credentials: 'same-origin', headers: { Accept: 'application/json' } }
      : {
          method: 'POST', credentials: 'same-origin', body: JSON.stringify(body),
          headers: { Accept: 'application/json', 'Content-Type': 'application/json', 'X-Board-Csrf': csrf }
        };
    return fetch(base + '/api/' + path, init).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (!response.ok) {
          var error = new Error(data.detail || data.message || ('The server answered ' + response.status + '.'));
          error.status = response.status;
          throw error;
        }
        return data;
      });
    });
  }

  function toast(text, isError) {
    var box = $('toast');
    box.textContent = text;
    box.className = isError ? 'shown error' : 'shown';
    clearTimeout(toast.timer);
    toast.timer = setTimeout(function () { box.className = ''; }, 6000);
  }

  function duration(ms) {
    var s = Math.round(Math.abs(ms) / 1000);
    if (s < 120) return s + ' s';
    var m = Math.round(s / 60);
    if (m < 120) return m + ' min';
    return Math.round(m / 60) + ' h';
  }

  function when(iso) {
    var ms = Date.parse(iso) - Date.now();
    return ms >= 0 ? 'in ' + duration(ms) : duration(ms) + ' ago';
  }

  function confirmAction(text, label) {
    var dialog = $('confirm');
    $('confirm-text').textContent = text;
    $('confirm-ok').textContent = label;
    return new Promise(function (resolve) {
      dialog.addEventListener('close', function onClose() {
        dialog.removeEventListener('close', onClose);
        resolve(dialog.returnValue === 'ok');
      });
      dialog.returnValue = '';
      dialog.showModal();
    });
  }

  function unavailable(part) { return part && typeof part.unavailable === 'string' ? part.unavailable : undefined; }

  function card(label, value, id) {
    return el('div', { class: 'card', id: id }, [el('div', { class: 'value' }, [value]), el('div', { class: 'label' }, [label])]);
  }

  function definitions(target, pairs) {
    clear(target);
    pairs.forEach(function (pair) {
      target.appendChild(el('dt', {}, [pair[0]]));
      target.appendChild(el('dd', {}, [pair[1]]));
    });
  }

  function renderKeys(keys) {
    var cards = clear($('key-cards'));
    var body = clear($('tenants').querySelector('tbody'));
    var note = $('keys-note');
    note.textContent = '';
    if (unavailable(keys)) { note.textContent = unavailable(keys); return; }
    cards.appendChild(card('in flight', keys.totals.inFlight, 'count-in-flight'));
    cards.appendChild(card('of which past their lease', keys.totals.leasePassed, 'count-lease-passed'));
    cards.appendChild(card('completed', keys.totals.completed, 'count-completed'));
    cards.appendChild(card('expired, awaiting the sweep', keys.totals.expired, 'count-expired'));
    keys.tenants.forEach(function (row) {
      body.appendChild(el('tr', {}, [
        el('td', {}, [row.tenant]), el('td', {}, [row.inFlight]), el('td', {}, [row.leasePassed]),
        el('td', {}, [row.completed]), el('td', {}, [row.expired])
      ]));
    });
    if (keys.tenantCount > keys.tenants.length) {
      note.textContent = 'The ' + keys.tenants.length + ' tenants with the most keys of ' + keys.tenantCount + '.';
    }
  }

  function renderSweeper(sweeper, expired) {
    var last = sweeper.lastRun;
    definitions($('sweeper'), [
      ['Scheduled', sweeper.scheduled ? 'every ' + duration(sweeper.intervalMs) : 'no (sweep() is called by the app)'],
      ['Last run', last ? when(last.finishedAt) + (last.failed ? ', failed' : last.ran ? ', deleted ' + last.deleted : ', another instance swept') : 'none in this instance yet'],
      ['Backlog', typeof expired === 'number' ? expired + ' expired keys' : 'unknown']
    ]);
  }

  function renderOutbox(outbox) {
    if (outbox === null) { definitions($('outbox'), [['Outbox', 'not configured']]); return; }
    if (unavailable(outbox)) { definitions($('outbox'), [['Outbox', unavailable(outbox)]]); return; }
    definitions($('outbox'), [['Pending', outbox.pending], ['Retrying', outbox.retrying], ['Dead', outbox.dead]]);
  }

  var SVG = 'http://www.w3.org/2000/svg';
  function svg(tag, attributes) {
    var element = document.createElementNS(SVG, tag);
    Object.keys(attributes).forEach(function (name) { element.setAttribute(name, attributes[name]); });
    return element;
  }

  function renderChart(perMinute) {
    var target = clear($('chart'));
    var width = 720, height = 180, left = 40, bottom = 20, top = 8;
    var max = 1;
    perMinute.forEach(function (minute) {
      var total = OUTCOMES.reduce(function (sum, outcome) { return sum + minute[outcome]; }, 0);
      if (total > max) max = total;
    });
    var chart = svg('svg', { viewBox: '0 0 ' + width + ' ' + height, role: 'img', 'aria-label': 'Outcomes per minute over the last hour', id: 'outcome-chart' });
    var plotHeight = height - bottom - top;
    var step = (width - left) / perMinute.length;
    [0, 0.5, 1].forEach(function (fraction) {
      var y = top + plotHeight * (1 - fraction);
      chart.appendChild(svg('line', { x1: left, x2: width, y1: y, y2: y, class: 'grid' }));
      var label = svg('text', { x: left - 4, y: y + 4, class: 'axis', 'text-anchor': 'end' });
      label.textContent = String(Math.round(max * fraction));
      chart.appendChild(label);
    });
    perMinute.forEach(function (minute, index) {
      var y = top + plotHeight;
      OUTCOMES.forEach(function (outcome) {
        var count = minute[outcome];
        if (!count) return;
        var h = (count / max) * plotHeight;
        y -= h;
        var bar = svg('rect', { x: left + index * step + 1, y: y, width: Math.max(1, step - 2), height: h, class: 'bar ' + outcome });
        var title = svg('title', {});
        title.textContent = minute.minute.slice(11, 16) + ' UTC: ' + count + ' ' + OUTCOME_LABELS[outcome];
        bar.appendChild(title);
        chart.appendChild(bar);
      });
    });
    [0, 30, 59].forEach(function (index) {
      var label = svg('text', { x: index === 59 ? width : left + index * step + step / 2, y: height - 4, class: 'axis', 'text-anchor': index === 59 ? 'end' : 'middle' });
      label.textContent = index === 59 ? 'now' : (59 - index) + ' min ago';
      chart.appendChild(label);
    });
    target.appendChild(chart);
    var legend = clear($('legend'));
    OUTCOMES.forEach(function (outcome) {
      legend.appendChild(el('li', {}, [el('span', { class: 'swatch ' + outcome }, []), OUTCOME_LABELS[outcome]]));
    });
  }

  function renderRoutes(perRoute) {
    var head = $('routes').querySelector('thead tr');
    if (head.children.length === 1) OUTCOMES.forEach(function (outcome) { head.appendChild(el('th', {}, [OUTCOME_LABELS[outcome]])); });
    var body = clear($('routes').querySelector('tbody'));
    perRoute.forEach(function (row) {
      // What a request names, the handler beneath it as a detail.
      var route = el('td', { class: 'route' }, [row.label || row.route]);
      if (row.label && row.label !== row.route) route.appendChild(el('div', { class: 'handler' }, [row.route]));
      body.appendChild(el('tr', {}, [route].concat(OUTCOMES.map(function (outcome) { return el('td', {}, [row[outcome]]); }))));
    });
  }

  function loadOverview() {
    return api('overview').then(function (data) {
      renderKeys(data.keys);
      renderSweeper(data.sweeper, unavailable(data.keys) ? undefined : data.keys.totals.expired);
      renderOutbox(data.outbox);
      var outcomes = $('outcomes');
      if (data.outcomes) {
        outcomes.hidden = false;
        renderChart(data.outcomes.perMinute);
        renderRoutes(data.outcomes.perRoute);
      } else {
        outcomes.hidden = true;
      }
    });
  }

  function loadStuck() {
    return api('stuck').then(function (data) {
      var body = clear($('stuck-keys').querySelector('tbody'));
      if (unavailable(data.keys)) { body.appendChild(el('tr', {}, [el('td', { colspan: '6' }, [unavailable(data.keys)])])); return; }
      if (data.keys.length === 0) body.appendChild(el('tr', { class: 'empty' }, [el('td', { colspan: '6' }, ['No key is in flight.'])]));
      data.keys.forEach(function (key) {
        var button = el('button', { type: 'button', class: 'release' }, ['Release']);
        button.addEventListener('click', function () { release(key); });
        body.appendChild(el('tr', { class: key.leasePassed ? 'stuck lease-passed' : 'stuck' }, [
          el('td', {}, [key.tenant]), el('td', { class: 'key' }, [key.key]), el('td', {}, [key.attempt]),
          el('td', {}, [duration(key.ageMs)]), el('td', {}, [key.leasePassed ? 'passed ' + when(key.leaseExpiresAt) : when(key.leaseExpiresAt)]),
          el('td', {}, [button])
        ]));
      });
    });
  }

  function release(key) {
    confirmAction(
      'Release key ' + key.key + ' of tenant ' + key.tenant + '? Its lease ends now, so the next retry takes the key ' +
        'over and runs the handler at once. If attempt ' + key.attempt + ' is in fact still running, its work is rolled ' +
        'back when it tries to complete (its client gets 409), and only the retry\'s result stands.',
      'Release'
    ).then(function (confirmed) {
      if (!confirmed) return;
      api('stuck/release', { tenant: key.tenant, ref: key.ref })
        .then(function () { toast('Released ' + key.key + ': the next retry runs at once.'); })
        .catch(function (error) { toast(error.message, true); })
        .then(refresh);
    });
  }

  function loadDeadLetters() {
    return api('dead-letters').then(function (data) {
      var body = clear($('dead-letters').querySelector('tbody'));
      $('redrive-all').disabled = !data.configured || unavailable(data.messages) !== undefined || data.messages.length === 0;
      if (!data.configured) { body.appendChild(el('tr', {}, [el('td', { colspan: '7' }, ['The outbox is not configured.'])])); return; }
      if (unavailable(data.messages)) { body.appendChild(el('tr', {}, [el('td', { colspan: '7' }, [unavailable(data.messages)])])); return; }
      if (data.messages.length === 0) body.appendChild(el('tr', { class: 'empty' }, [el('td', { colspan: '7' }, ['No dead letters.'])]));
      data.messages.forEach(function (message) {
        var button = el('button', { type: 'button', class: 'redrive' }, ['Redrive']);
        button.addEventListener('click', function () { redrive([message.id], 'message ' + message.id + ' (' + message.topic + ')'); });
        body.appendChild(el('tr', { class: 'dead-letter' }, [
          el('td', {}, [message.id]), el('td', {}, [message.tenant === null ? '' : message.tenant]), el('td', {}, [message.topic]),
          el('td', {}, [message.attempts]), el('td', { class: 'error' }, [message.lastError || '']), el('td', {}, [when(message.createdAt)]),
          el('td', {}, [button])
        ]));
      });
    });
  }

  function redrive(ids, what) {
    confirmAction('Redrive ' + what + '? It goes back to the queue and is delivered again, from its first attempt.', 'Redrive')
      .then(function (confirmed) {
        if (!confirmed) return;
        api('dead-letters/redrive', ids ? { ids: ids } : { all: true })
          .then(function (data) { toast('Redriven: ' + data.redriven + '.'); })
          .catch(function (error) { toast(error.message, true); })
          .then(refresh);
      });
  }

  function lookup(event) {
    event.preventDefault();
    var result = clear($('lookup-result'));
    var typed = $('lookup-key').value;
    api('lookup', { tenant: $('lookup-tenant').value, key: typed })
      .then(function (key) {
        // The key as this operator typed it (the server never sends a whole key), and as the lists show it.
        var pairs = [
          ['Tenant', key.tenant], ['Key', typed], ['Listed as', key.key], ['State', key.state], ['Attempts', key.attempt],
          ['Generation', key.generation || ''], ['Created', key.createdAt]
        ];
        if (key.leaseExpiresAt) pairs.push([key.state === 'lease-passed' ? 'Lease ended' : 'Lease ends', key.leaseExpiresAt]);
        pairs = pairs.concat([
          ['Completed', key.completedAt || ''], ['Expires', key.expiresAt],
          ['Stored status', key.responseStatus === null ? '' : key.responseStatus]
        ]);
        var list = el('dl', { id: 'lookup-details' }, []);
        definitions(list, pairs);
        result.appendChild(list);
        if (key.response) {
          result.appendChild(el('h3', {}, ['Stored response' + (key.response.truncated ? ' (first 64 KiB)' : '')]));
          result.appendChild(el('pre', {}, [JSON.stringify(key.response.headers)]));
          result.appendChild(el('pre', {}, [key.response.body]));
        }
      })
      .catch(function (error) { result.appendChild(el('p', { class: 'error', id: 'lookup-error' }, [error.message])); });
  }

  function refresh() {
    return Promise.all([loadOverview(), loadStuck(), loadDeadLetters()])
      .then(function () { $('updated').textContent = 'Updated ' + new Date().toLocaleTimeString(); })
      .catch(function (error) { toast(error.message, true); });
  }

  document.addEventListener('DOMContentLoaded', function () {
    if (scopedTenant) { $('lookup-tenant').value = scopedTenant; $('lookup-tenant').readOnly = true; }
    $('refresh').addEventListener('click', refresh);
    $('redrive-all').addEventListener('click', function () { redrive(undefined, 'every dead letter shown'); });
    $('lookup-form').addEventListener('submit', lookup);
    refresh();
    setInterval(function () { if (!document.hidden && !$('confirm').open) refresh(); }, 10000);
  });
})();
`;
