// The browser-server launcher grid-worker runs for `--launcher playwright`.
// It starts Playwright's browser server (browserType.launchServer) with a
// fixed WebSocket path and prints one JSON line on stdout once it listens:
//
//   {"event":"listening","wsEndpoint":"ws://127.0.0.1:PORT/playwright","browserPid":1234}
//
// grid-worker reads wsEndpoint (any ws:// URL on a stdout line will do) and
// browserPid (Playwright starts the browser in its own process group, so
// the agent kills that group too and no browser is left behind).
//
//   node launch-server.mjs --browser chromium --executable /usr/bin/chromium \
//        --host 127.0.0.1 --port 0 --ws-path /playwright
//
// It exits when the browser exits (status 1) and closes the server on
// SIGTERM or SIGINT (status 0). Clients must use the same playwright-core
// major.minor as this package pins (package.json); the server answers 428
// otherwise.

import { chromium, firefox, webkit } from 'playwright-core';

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
	const opts = { browser: 'chromium', executable: '', host: '127.0.0.1', port: 0, wsPath: '/playwright', args: [] };
	for (let i = 0; i < argv.length; i++) {
		const key = argv[i];
		const val = argv[i + 1];
		if (val === undefined) throw new Error(`${key} needs a value`);
		switch (key) {
			case '--browser': opts.browser = val; break;
			case '--executable': opts.executable = val; break;
			case '--host': opts.host = val; break;
			case '--port': opts.port = Number(val); break;
			case '--ws-path': opts.wsPath = val; break;
			case '--arg': opts.args.push(val); break;
			default: throw new Error(`unknown argument '${key}'`);
		}
		i++;
	}
	const types = { chromium, firefox, webkit };
	if (!types[opts.browser]) throw new Error(`--browser must be chromium, firefox or webkit, not '${opts.browser}'`);
	if (!Number.isInteger(opts.port) || opts.port < 0 || opts.port > 65535) throw new Error('--port must be 0..65535');
	if (!opts.wsPath.startsWith('/')) throw new Error('--ws-path must start with /');
	opts.type = types[opts.browser];
	return opts;
}

async function main() {
	let opts;
	try {
		opts = parseArgs(process.argv.slice(2));
	} catch (e) {
		process.stderr.write(`launch-server: ${e.message}\n`);
		process.exit(2);
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
	if (opts.executable) launchOpts.executablePath = opts.executable;

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
	process.stdout.write(JSON.stringify({ event: 'listening', wsEndpoint: server.wsEndpoint(), browserPid: proc.pid }) + '\n');
}

main().catch((e) => {
	process.stderr.write(`launch-server: ${e && e.stack ? e.stack : e}\n`);
	process.exit(1);
});
