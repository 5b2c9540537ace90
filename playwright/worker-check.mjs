// Checks one worker's browser directly (no grid in between), the way a
// Playwright user would: connect, open a page, set its content, evaluate
// JavaScript, close. Used by the worker agent's tests and handy for an
// operator checking a worker by hand:
//
//   node worker-check.mjs connect ws://10.0.0.7:3131/playwright
//   node worker-check.mjs cdp     ws://10.0.0.7:9222/devtools/browser/<id>
//
// `connect` uses chromium.connect (Playwright's browser server, the
// playwright launcher); `cdp` uses chromium.connectOverCDP (the cdp
// launcher). It prints one JSON line and exits 0 when every step worked:
//
//   {"ok":true,"mode":"connect","title":"worker check","answer":42,"text":"hello from the worker","version":"156.0...","ms":310}

import { chromium } from 'playwright-core';

const [mode, url, timeoutArg] = process.argv.slice(2);
const timeout = Number(timeoutArg || 30000);

async function check() {
	if (!['connect', 'cdp'].includes(mode) || !url) {
		throw new Error('usage: node worker-check.mjs connect|cdp <ws-url> [timeout-ms]');
	}
	const start = Date.now();
	const browser = mode === 'cdp'
		? await chromium.connectOverCDP(url, { timeout })
		: await chromium.connect(url, { timeout });
	try {
		const context = await browser.newContext();
		const page = await context.newPage();
		await page.setContent('<title>worker check</title><p id="msg">hello from the worker</p>');
		const title = await page.title();
		const answer = await page.evaluate(() => [1, 2, 3, 36].reduce((a, b) => a + b, 0));
		const text = await page.textContent('#msg');
		await page.close();
		await context.close();
		return { ok: true, mode, title, answer, text, version: browser.version(), ms: Date.now() - start };
	} finally {
		await browser.close();
	}
}

check().then(
	(res) => { process.stdout.write(JSON.stringify(res) + '\n'); process.exit(0); },
	(err) => { process.stdout.write(JSON.stringify({ ok: false, mode, error: String(err && err.message || err) }) + '\n'); process.exit(1); },
);
