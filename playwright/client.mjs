// A Playwright client of the grid, used by `make run`'s demo and by the
// end-to-end tests. It talks to the grid the way a user's test suite would:
// chromium.connect() (or connectOverCDP) to a wss:// URL served by Caddy.
// Trust for Caddy's internal CA comes from NODE_EXTRA_CA_CERTS; certificate
// checks are never turned off.
//
//   node client.mjs run  --url wss://localhost:8443/playwright/chromium --sessions 36 --concurrency 3
//   node client.mjs hold --url ...        # one session, open until stdin closes or SIGTERM
//   node client.mjs cdp  --url ...        # one session through connectOverCDP
//   node client.mjs puppeteer --url ...   # one session through Puppeteer: connect({ browserURL }) for an
//                                         # http(s):// URL (no headers), { browserWSEndpoint } for ws(s)://
//   node client.mjs run  --url ... --header 'Authorization: Bearer <token>'   # sent on the upgrade (repeatable)
//   node client.mjs run  --url ... --playwright-version 1.64   # a client of another installed playwright-core
//   node client.mjs run  --url ... --video DIR        # the context records video into DIR (the session's
//                                                     # line gives "video": the file and its size)
//   node client.mjs run  --url ... --expose-network '<loopback>' --goto http://localhost:PORT/
//                                                     # the page loads a URL of the client's own network
//
// --playwright-version loads the npm alias playwright-core-<major.minor>
// (package.json installs 1.63, 1.64 and 1.65); default: playwright-core.
// Every line carries "version", the version of the playwright-core loaded.
//
// Every session prints one JSON line on stdout, firstPageMs the time from
// the connect to a page with its content:
//   {"event":"session","n":1,"ok":true,"title":"grid session 1","answer":42,"firstPageMs":250,"ms":312}
// and `run` ends with {"event":"summary","sessions":36,"ok":36,"failed":0,"ms":...}.
// The exit code is 0 only when every session succeeded.

import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let chromium;
let version;

function parseArgs(argv) {
	const [mode = 'run', ...rest] = argv;
	const opts = { mode, url: '', sessions: 1, concurrency: 1, timeout: 30000, holdMs: 0, headers: {}, playwrightVersion: '', video: '', exposeNetwork: '', goto: '' };
	for (let i = 0; i < rest.length; i++) {
		const key = rest[i];
		const val = rest[i + 1];
		switch (key) {
			case '--url': opts.url = val; i++; break;
			case '--sessions': opts.sessions = Number(val); i++; break;
			case '--concurrency': opts.concurrency = Number(val); i++; break;
			case '--timeout': opts.timeout = Number(val); i++; break;
			case '--hold-ms': opts.holdMs = Number(val); i++; break;
			case '--playwright-version': opts.playwrightVersion = val; i++; break;
			case '--video': opts.video = val; i++; break;
			case '--expose-network': opts.exposeNetwork = val; i++; break;
			case '--goto': opts.goto = val; i++; break;
			case '--header': {
				const at = (val ?? '').indexOf(':');
				if (at < 1) throw new Error(`--header wants 'Name: value', got '${val}'`);
				opts.headers[val.slice(0, at).trim()] = val.slice(at + 1).trim();
				i++;
				break;
			}
			default:
				throw new Error(`unknown argument '${key}'`);
		}
	}
	if (!['run', 'hold', 'cdp', 'puppeteer'].includes(opts.mode)) {
		throw new Error(`unknown mode '${opts.mode}' (want run, hold, cdp or puppeteer)`);
	}
	if (!opts.url) throw new Error('--url is required');
	for (const k of ['sessions', 'concurrency', 'timeout', 'holdMs']) {
		if (!Number.isInteger(opts[k]) || opts[k] < 0) throw new Error(`--${k} must be a whole number`);
	}
	if (opts.concurrency < 1) opts.concurrency = 1;
	return opts;
}

function emit(obj) {
	process.stdout.write(JSON.stringify({ ...obj, version }) + '\n');
}

// loadPlaywright imports the playwright-core the options name.
async function loadPlaywright(want) {
	if (want && !/^\d+\.\d+$/.test(want)) throw new Error(`--playwright-version wants major.minor, e.g. 1.64, not '${want}'`);
	const pkg = want ? `playwright-core-${want}` : 'playwright-core';
	try {
		version = require(`${pkg}/package.json`).version;
	} catch {
		throw new Error(`${pkg} is not installed (see package.json; run make deps)`);
	}
	const mod = await import(pkg);
	chromium = (mod.default ?? mod).chromium;
}

// puppeteerSession is session for Puppeteer.
async function puppeteerSession(opts, n) {
	const start = Date.now();
	let browser;
	try {
		const puppeteer = (await import('puppeteer-core')).default;
		const target = opts.url.startsWith('http') ? { browserURL: opts.url } : { browserWSEndpoint: opts.url, headers: opts.headers };
		browser = await puppeteer.connect({ ...target, protocolTimeout: opts.timeout });
		const page = await browser.newPage();
		await page.setContent(`<title>grid session ${n}</title>`);
		const title = await page.title();
		const answer = await page.evaluate(() => 6 * 7);
		await page.close();
		await browser.disconnect();
		const ok = title === `grid session ${n}` && answer === 42;
		emit({ event: 'session', n, ok, title, answer, ms: Date.now() - start });
		return ok;
	} catch (err) {
		if (browser) await browser.disconnect().catch(() => {});
		const msg = String(err?.message ?? err);
		emit({ event: 'session', n, ok: false, error: msg.split('\n')[0], detail: msg.slice(0, 2000), ms: Date.now() - start });
		return false;
	}
}

// One short session: open a page, set its content, read the title back,
// evaluate JavaScript, close.
async function session(opts, n) {
	if (opts.mode === 'puppeteer') return puppeteerSession(opts, n);
	const start = Date.now();
	let browser;
	try {
		browser = opts.mode === 'cdp'
			? await chromium.connectOverCDP(opts.url, { timeout: opts.timeout, headers: opts.headers })
			: await chromium.connect(opts.url, { timeout: opts.timeout, headers: opts.headers, exposeNetwork: opts.exposeNetwork || undefined });
		const ctxOpts = opts.video ? { recordVideo: { dir: opts.video } } : {};
		const context = opts.mode === 'cdp' ? (browser.contexts()[0] ?? await browser.newContext()) : await browser.newContext(ctxOpts);
		const page = await context.newPage();
		let title;
		if (opts.goto) {
			await page.goto(opts.goto, { timeout: opts.timeout });
			title = await page.title();
		} else {
			await page.setContent(`<title>grid session ${n}</title><p id="p">hello from session ${n}</p>`);
			title = await page.title();
		}
		const firstPageMs = Date.now() - start;
		const answer = await page.evaluate(() => 6 * 7);
		if (opts.holdMs > 0) await new Promise((r) => setTimeout(r, opts.holdMs));
		if (opts.mode === 'hold') {
			emit({ event: 'ready', n, title });
			await new Promise((resolve) => {
				process.stdin.resume();
				process.stdin.on('end', resolve);
				process.stdin.on('close', resolve);
				process.on('SIGTERM', resolve);
				// the grid ended the session: the page's next call fails
				// with the reason the close frame gave
				browser.on('disconnected', resolve);
			});
			if (!browser.isConnected()) await page.title();
		}
		const video = page.video();
		await page.close();
		let saved;
		if (video) {
			// a remote browser's video reaches the client by saveAs
			const file = `${opts.video}/session-${n}.webm`;
			await video.saveAs(file);
			saved = { file, bytes: (await import('node:fs')).statSync(file).size };
		}
		await browser.close();
		const ok = (opts.goto ? true : title === `grid session ${n}`) && answer === 42 && (!opts.video || saved?.bytes > 0);
		emit({ event: 'session', n, ok, title, answer, video: saved, firstPageMs, ms: Date.now() - start });
		return ok;
	} catch (err) {
		if (browser) await browser.close().catch(() => {});
		const msg = String(err?.message ?? err);
		emit({ event: 'session', n, ok: false, error: msg.split('\n')[0], detail: msg.slice(0, 2000), ms: Date.now() - start });
		return false;
	}
}

async function main() {
	let opts;
	try {
		opts = parseArgs(process.argv.slice(2));
		await loadPlaywright(opts.playwrightVersion);
	} catch (err) {
		process.stderr.write(`client.mjs: ${err.message}\n`);
		process.exit(2);
	}
	const total = opts.mode === 'run' ? opts.sessions : 1;
	const start = Date.now();
	let next = 1;
	let ok = 0;
	async function lane() {
		while (next <= total) {
			const n = next++;
			if (await session(opts, n)) ok++;
		}
	}
	await Promise.all(Array.from({ length: Math.min(opts.concurrency, total) }, lane));
	emit({ event: 'summary', sessions: total, ok, failed: total - ok, ms: Date.now() - start });
	process.exit(ok === total ? 0 : 1);
}

main();
