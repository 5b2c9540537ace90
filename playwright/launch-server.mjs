// The browser-server launcher grid-worker runs for `--launcher playwright`
// and `--launcher playwright-server`. In the shared mode (playwright) it
// starts Playwright's browser server (browserType.launchServer): one
// browser whose contexts the worker's sessions share. In the per-session
// mode (playwright-server) it starts Playwright's own run-server, which
// launches a browser for each connection with the client's launch options
// and closes it when the connection ends; it applies only the options its
// safe mode allows, never the client's executable or args: it never runs
// in its unsafe mode. Either way it
// prints one JSON line on stdout once it listens:
//
//   {"event":"listening","wsEndpoint":"ws://127.0.0.1:PORT/playwright","browserPid":1234,"playwrightVersion":"1.65.1","video":true}
//
// The browsers Playwright looks for in its own folders are the system's:
// --browsers-dir is made the PLAYWRIGHT_BROWSERS_PATH of this process, and
// holds, at the paths the loaded playwright-core expects for its revisions
// (its browsers.json), links to --executable (as Chromium), to
// --headless-shell (as its headless shell, which headless browsers run
// on; --executable without one) and to --ffmpeg, which records videos.
// "video" says whether there is one. The shared browser, always
// headless, runs on the headless shell too.
//
// grid-worker reads wsEndpoint (any ws:// URL on a stdout line will do),
// browserPid (Playwright starts the browser in its own process group, so
// the agent kills that group too and no browser is left behind) and
// playwrightVersion, the version field of the package.json of the
// playwright-core this script loaded: the worker registers in that
// version's group, so that only clients of its major.minor reach it (the
// server answers 428 to any other).
//
//   node launch-server.mjs --browser chromium --executable /usr/bin/chromium \
//        --host 127.0.0.1 --port 0 --ws-path /playwright [--playwright-version 1.64] \
//        [--mode shared|per-session] [--browsers-dir DIR --ffmpeg /usr/bin/ffmpeg]
//        [--headless-shell /usr/bin/chromium-headless-shell]
//
// --playwright-version picks which installed playwright-core to load: the
// npm alias playwright-core-<major.minor> (package.json installs two).
// Default: the newest alias installed, else playwright-core itself.
//
// Chromium flags, in the per-session mode: the agent vets a session's
// args (Caddy's launch_args) and asks, one JSON line on stdin each, for a
// run-server whose browsers get them:
//
//   {"acquire":7,"args":["--accept-lang=de"]}  answered on stdout by
//   {"event":"flags","id":7,"wsEndpoint":"ws://127.0.0.1:PORT/playwright"}
//   (or "error" in place of wsEndpoint), and later {"release":7}
//
// Each set of flags has a run-server of its own, whose browser is a
// wrapper that runs --executable with the flags ahead of Playwright's:
// the flags come from the agent, never from the client's launch options.
// A run-server whose sessions all ended stays for the next one with the
// same flags for flagsLinger, at most maxIdleFlagSets of them.
//
// It exits when the browser (or the run-server) exits (status 1) and closes
// the server on SIGTERM or SIGINT (status 0).

import { createRequire } from 'node:module';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

const require = createRequire(import.meta.url);

// installedVersions lists the playwright-core-<major.minor> aliases under
// node_modules, oldest first.
function installedVersions() {
	const dir = path.join(path.dirname(require.resolve('playwright-core/package.json')), '..');
	const out = [];
	for (const name of fs.readdirSync(dir)) {
		const m = /^playwright-core-(\d+)\.(\d+)$/.exec(name);
		if (m) out.push({ name, major: Number(m[1]), minor: Number(m[2]) });
	}
	return out.sort((a, b) => a.major - b.major || a.minor - b.minor);
}

// pickPlaywright names the playwright-core package the flag asks for.
function pickPlaywright(want) {
	const all = installedVersions();
	let pkg = 'playwright-core';
	if (want) {
		if (!/^\d+\.\d+$/.test(want)) throw new Error(`--playwright-version wants major.minor, e.g. 1.64, not '${want}'`);
		const hit = all.find((v) => `${v.major}.${v.minor}` === want);
		if (!hit) {
			const have = all.map((v) => `${v.major}.${v.minor}`).join(', ') || 'none';
			throw new Error(`playwright-core ${want} is not installed (installed: ${have}); add an alias playwright-core-${want} to package.json`);
		}
		pkg = hit.name;
	} else if (all.length > 0) {
		pkg = all[all.length - 1].name;
	}
	return pkg;
}

// ownBuilds is where Playwright's own builds are installed, read before
// this process points PLAYWRIGHT_BROWSERS_PATH at its own folder.
const ownBuilds = process.env.PLAYWRIGHT_BROWSERS_PATH || path.join(process.env.HOME || '/', '.cache', 'ms-playwright');

// prepareBrowsers links the system's browser, its headless shell and
// ffmpeg where the playwright-core of pkg looks for its own builds, under
// dir. It returns whether video can be recorded.
function prepareBrowsers(pkg, dir, executable, shell, ffmpeg) {
	const revisions = {};
	const root = path.dirname(require.resolve(`${pkg}/package.json`));
	for (const b of JSON.parse(fs.readFileSync(path.join(root, 'browsers.json'), 'utf8')).browsers) revisions[b.name] = b.revision;
	const link = (name, rel, target) => {
		if (!revisions[name] || !target) return false;
		const at = path.join(dir, `${name.replaceAll('-', '_')}-${revisions[name]}`, ...rel);
		fs.mkdirSync(path.dirname(at), { recursive: true });
		fs.rmSync(at, { force: true });
		fs.symlinkSync(target, at);
		return true;
	};
	if (executable) {
		link('chromium', ['chrome-linux64', 'chrome'], executable);
		link('chromium-headless-shell', ['chrome-headless-shell-linux64', 'chrome-headless-shell'], shell || executable);
	}
	const video = link('ffmpeg', ['ffmpeg-linux'], ffmpeg);
	// Playwright's own builds where they are installed (its Firefox and
	// WebKit, in Playwright's image): linked beside, where nothing of the
	// system's stands.
	if (ownBuilds !== dir && fs.existsSync(ownBuilds)) {
		for (const name of fs.readdirSync(ownBuilds)) {
			const at = path.join(dir, name);
			if (!fs.existsSync(at)) fs.symlinkSync(path.join(ownBuilds, name), at);
		}
	}
	return video || fs.existsSync(path.join(dir, `ffmpeg-${revisions.ffmpeg}`, 'ffmpeg-linux'));
}

// The Chromium flags that work on a machine without internet access
// (DESIGN.md, "Real parts"): without them Chromium keeps dialing Google.
const CHROMIUM_ARGS = [
	'--headless',
	'--no-sandbox',
	'--disable-gpu',
	'--disable-background-networking',
	'--disable-component-update',
	'--disable-sync',
	'--no-first-run',
];

function parseArgs(argv) {
	const opts = { browser: 'chromium', executable: '', headlessShell: '', host: '127.0.0.1', port: 0, wsPath: '/playwright', args: [], playwrightVersion: '', mode: 'shared', browsersDir: '', ffmpeg: '' };
	for (let i = 0; i < argv.length; i++) {
		const key = argv[i];
		const val = argv[i + 1];
		if (val === undefined) throw new Error(`${key} needs a value`);
		switch (key) {
			case '--browser': opts.browser = val; break;
			case '--executable': opts.executable = val; break;
			case '--headless-shell': opts.headlessShell = val; break;
			case '--host': opts.host = val; break;
			case '--port': opts.port = Number(val); break;
			case '--ws-path': opts.wsPath = val; break;
			case '--arg': opts.args.push(val); break;
			case '--playwright-version': opts.playwrightVersion = val; break;
			case '--mode': opts.mode = val; break;
			case '--browsers-dir': opts.browsersDir = val; break;
			case '--ffmpeg': opts.ffmpeg = val; break;
			default: throw new Error(`unknown argument '${key}'`);
		}
		i++;
	}
	if (!['chromium', 'firefox', 'webkit'].includes(opts.browser)) throw new Error(`--browser must be chromium, firefox or webkit, not '${opts.browser}'`);
	if (!Number.isInteger(opts.port) || opts.port < 0 || opts.port > 65535) throw new Error('--port must be 0..65535');
	if (!opts.wsPath.startsWith('/')) throw new Error('--ws-path must start with /');
	if (!['shared', 'per-session'].includes(opts.mode)) throw new Error(`--mode must be shared or per-session, not '${opts.mode}'`);
	return opts;
}

// runServer starts Playwright's run-server of pkg, on port (0: any),
// whose browsers are those under browsersDir, and resolves with its
// endpoint once it listens.
function runServer(pkg, opts, port, browsersDir) {
	const cli = path.join(path.dirname(require.resolve(`${pkg}/package.json`)), 'cli.js');
	const args = [cli, 'run-server', '--host', opts.host, '--port', String(port), '--path', opts.wsPath];
	if (opts.browsersDir) args.push('--artifacts-dir', path.join(opts.browsersDir, 'artifacts'));
	const env = browsersDir ? { ...process.env, PLAYWRIGHT_BROWSERS_PATH: browsersDir } : process.env;
	// run-server dies with this process, however it ends (grid-worker
	// has the kernel kill this one if the agent dies): util-linux's
	// setpriv sets the child's parent-death signal before it runs
	const setpriv = '/usr/bin/setpriv';
	const child = fs.existsSync(setpriv)
		? spawn(setpriv, ['--pdeathsig', 'KILL', process.execPath, ...args], { stdio: ['ignore', 'pipe', 'inherit'], env })
		: spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'], env });
	return new Promise((resolve, reject) => {
		let out = '';
		child.stdout.on('data', (b) => {
			out += b;
			const m = /Listening on (ws:\/\/\S+)/.exec(out);
			if (m) resolve({ child, wsEndpoint: m[1] });
		});
		child.on('exit', (code) => reject(new Error(`run-server exited with ${code} before listening: ${out.trim()}`)));
	});
}

// flagsLinger is how long a set of flags' run-server outlives its last
// session; maxIdleFlagSets bounds how many wait so.
const flagsLinger = 30_000;
const maxIdleFlagSets = 2;

// shellQuote quotes s for sh.
const shellQuote = (s) => `'${s.replaceAll("'", `'\\''`)}'`;

// flagSets serves the agent's requests for run-servers with flags, read
// from stdin (see the top of this file).
function flagSets(pkg, opts) {
	// the sets in use or waiting, by the JSON of their flags: each
	// { key, ready (resolves with { child, wsEndpoint }), refs, idleTimer,
	// idleSince }; one that left it (closed, or its server exited) is
	// not the one of its key any more
	const sets = new Map();
	const held = new Map(); // acquire id -> the set it holds
	let n = 0;
	const answer = (msg) => process.stdout.write(JSON.stringify({ event: 'flags', ...msg }) + '\n');
	// forget drops set from sets, unless a newer set of its flags is there
	const forget = (set) => sets.get(set.key) === set && sets.delete(set.key);
	const closeSet = (set) => {
		forget(set);
		clearTimeout(set.idleTimer);
		set.ready.then((r) => r.child.kill('SIGTERM'), () => {});
	};
	const start = (args, dir) => {
		if (opts.browser !== 'chromium' || !opts.executable) throw new Error('flags apply to Chromium only');
		fs.mkdirSync(dir, { recursive: true });
		const wrap = (name, exe) => {
			if (!exe) return '';
			const wrapper = path.join(dir, name);
			fs.writeFileSync(wrapper, `#!/bin/sh\nexec ${[exe, ...args].map(shellQuote).join(' ')} "$@"\n`, { mode: 0o755 });
			return wrapper;
		};
		prepareBrowsers(pkg, dir, wrap('chromium', opts.executable), wrap('headless-shell', opts.headlessShell), opts.ffmpeg);
		return runServer(pkg, opts, 0, dir);
	};
	const acquire = (id, args) => {
		const key = JSON.stringify(args);
		let set = sets.get(key);
		if (!set) {
			const dir = path.join(opts.browsersDir, `flags-${++n}`);
			set = { key, refs: 0, ready: Promise.resolve(args).then((a) => start(a, dir)) };
			const s = set;
			// its folder goes with its server
			const gone = () => {
				forget(s);
				fs.rmSync(dir, { recursive: true, force: true });
			};
			s.ready.then(({ child }) => child.on('exit', gone), gone);
			sets.set(key, set);
		}
		set.refs++;
		clearTimeout(set.idleTimer);
		held.set(id, set);
		set.ready.then(({ wsEndpoint }) => answer({ id, wsEndpoint }), (e) => answer({ id, error: e.message }));
	};
	const release = (id) => {
		const set = held.get(id);
		held.delete(id);
		if (!set || --set.refs > 0 || sets.get(set.key) !== set) return;
		set.idleSince = Date.now();
		set.idleTimer = setTimeout(() => closeSet(set), flagsLinger);
		const idle = [...sets.values()].filter((s) => s.refs === 0).sort((a, b) => a.idleSince - b.idleSince);
		for (const s of idle.slice(0, Math.max(0, idle.length - maxIdleFlagSets))) closeSet(s);
	};
	let buf = '';
	process.stdin.setEncoding('utf8');
	process.stdin.on('data', (chunk) => {
		buf += chunk;
		let i;
		while ((i = buf.indexOf('\n')) >= 0) {
			const line = buf.slice(0, i);
			buf = buf.slice(i + 1);
			try {
				const msg = JSON.parse(line);
				if (msg.release !== undefined) release(msg.release);
				else acquire(msg.acquire, msg.args);
			} catch (e) {
				process.stderr.write(`launch-server: bad request on stdin: ${e.message}\n`);
			}
		}
	});
	return { closeAll: () => [...sets.values()].forEach(closeSet) };
}

async function main() {
	let opts;
	let pw;
	let pkg;
	let video = false;
	try {
		opts = parseArgs(process.argv.slice(2));
		pkg = pickPlaywright(opts.playwrightVersion);
		if (opts.browsersDir) {
			video = prepareBrowsers(pkg, opts.browsersDir, opts.browser === 'chromium' ? opts.executable : '', opts.headlessShell, opts.ffmpeg);
			// before playwright-core loads: it reads the variable then
			process.env.PLAYWRIGHT_BROWSERS_PATH = opts.browsersDir;
		}
		const mod = await import(pkg);
		pw = { mod: mod.default ?? mod, version: require(`${pkg}/package.json`).version };
		opts.type = pw.mod[opts.browser];
	} catch (e) {
		process.stderr.write(`launch-server: ${e.message}\n`);
		process.exit(2);
	}
	if (opts.mode === 'per-session') {
		const { child, wsEndpoint } = await runServer(pkg, opts, opts.port, '');
		const flags = flagSets(pkg, opts);
		let closing = false;
		child.on('exit', (code, signal) => {
			if (closing) process.exit(0);
			process.stderr.write(`launch-server: run-server exited (code ${code}, signal ${signal})\n`);
			process.exit(1);
		});
		const close = () => {
			closing = true;
			flags.closeAll();
			child.kill('SIGTERM');
		};
		process.on('SIGTERM', close);
		process.on('SIGINT', close);
		process.stdout.write(JSON.stringify({ event: 'listening', wsEndpoint, playwrightVersion: pw.version, video }) + '\n');
		return;
	}
	const launchOpts = {
		headless: true,
		host: opts.host,
		port: opts.port,
		wsPath: opts.wsPath,
		// This script handles signals itself, so the order is: close the
		// server (and with it the browser), then exit.
		handleSIGINT: false,
		handleSIGTERM: false,
		handleSIGHUP: false,
		args: [...(opts.browser === 'chromium' ? CHROMIUM_ARGS : []), ...opts.args],
	};
	// grid-worker names a headless shell for Chromium only
	if (opts.executable) launchOpts.executablePath = opts.headlessShell || opts.executable;

	const server = await opts.type.launchServer(launchOpts);
	const proc = server.process();
	let closing = false;
	proc.on('exit', (code, signal) => {
		if (closing) return;
		process.stderr.write(`launch-server: the browser exited (code ${code}, signal ${signal})\n`);
		process.exit(1);
	});
	const close = async () => {
		if (closing) return;
		closing = true;
		try {
			await server.close();
		} finally {
			process.exit(0);
		}
	};
	process.on('SIGTERM', close);
	process.on('SIGINT', close);
	process.stdout.write(JSON.stringify({ event: 'listening', wsEndpoint: server.wsEndpoint(), browserPid: proc.pid, playwrightVersion: pw.version, video }) + '\n');
}

main().catch((e) => {
	process.stderr.write(`launch-server: ${e && e.stack ? e.stack : e}\n`);
	process.exit(1);
});
