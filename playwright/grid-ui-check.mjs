// Loads the browser_grid_ui page in headless Chromium and prints what it
// shows as one JSON line, for the Go test that compares it with the admin
// API (caddygrid/ui_test.go); optionally saves a screenshot.
//
//   node grid-ui-check.mjs --url http://127.0.0.1:8080/grid/ [--user u --password p]
//        [--after <unix-ms>] [--screenshot out.png] [--timeout 30000]
//
// --after waits until the page shows a sample taken at or after that time.
// It prints {"ok":true,"sampled_at":…,"error":"","pools":[{"pool":…,
// "figures":{…},"workers":[{"id":…,"status":…,"lifetime":"3 / 8",…}],
// "sessions":[{"id":…,"label":…,"worker":…,"state":…}],"sawtooth_lines":n,
// "left_marks":n,"legend":[…]}]} and exits 0, or {"ok":false,"error":…}.

import { chromium } from 'playwright-core';

function args(argv) {
	const o = { timeout: 30000, after: 0 };
	for (let i = 0; i < argv.length; i += 2) {
		const [k, v] = [argv[i], argv[i + 1]];
		if (!k.startsWith('--') || v === undefined) throw new Error(`bad argument ${k}`);
		o[k.slice(2)] = v;
	}
	if (!o.url) throw new Error('--url is required');
	o.timeout = Number(o.timeout);
	o.after = Number(o.after);
	return o;
}

async function main() {
	const o = args(process.argv.slice(2));
	const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', args: ['--no-sandbox'] });
	try {
		const ctxOpts = { viewport: { width: 1280, height: 900 } };
		if (o.user) ctxOpts.httpCredentials = { username: o.user, password: o.password || '' };
		const context = await browser.newContext(ctxOpts);
		const page = await context.newPage();
		const failed = [];
		page.on('requestfailed', (r) => failed.push(r.url()));
		page.on('pageerror', (e) => failed.push(`page error: ${e.message}`));
		await page.goto(o.url, { timeout: o.timeout });
		await page.waitForFunction((after) => {
			const s = document.getElementById('status');
			return s && Number(s.dataset.sampledAt || 0) >= after && Number(s.dataset.sampledAt) > 0;
		}, o.after, { timeout: o.timeout, polling: 100 });
		const shown = await page.evaluate(() => {
			const text = (e) => (e ? e.textContent.trim() : null);
			const status = document.getElementById('status');
			return {
				sampled_at: Number(status.dataset.sampledAt),
				status: text(status),
				pools: [...document.querySelectorAll('section.pool')].map((sec) => ({
					pool: sec.dataset.pool,
					figures: Object.fromEntries([...sec.querySelectorAll('[data-figure]')].map((f) => [f.dataset.figure, text(f.querySelector('b'))])),
					workers: [...sec.querySelectorAll('tr[data-worker]')].map((tr) => ({
						id: text(tr.querySelector('td.id')),
						status: text(tr.querySelector('td.status')),
						lifetime: text(tr.querySelector('td.lifetime .figure')),
						active: text(tr.querySelector('td.active .figure')),
						playwright: text(tr.querySelector('td.playwright')),
						heartbeat: text(tr.querySelector('td.heartbeat')),
					})),
					sessions: [...sec.querySelectorAll('tr[data-session]')].map((tr) => {
						const td = tr.querySelectorAll('td');
						return { id: text(td[0]), label: text(td[1]), worker: text(td[2]), state: text(td[5]) };
					}),
					sawtooth_lines: sec.querySelectorAll('.sawtooth polyline').length,
					left_marks: sec.querySelectorAll('.sawtooth circle.left').length,
					legend: [...sec.querySelectorAll('.sawtooth .legend span')].map(text),
				})),
			};
		});
		if (o.screenshot) await page.screenshot({ path: o.screenshot, fullPage: true });
		console.log(JSON.stringify({ ok: true, failed, ...shown }));
	} finally {
		await browser.close();
	}
}

main().catch((e) => {
	console.log(JSON.stringify({ ok: false, error: String(e && e.message ? e.message : e) }));
	process.exit(1);
});
