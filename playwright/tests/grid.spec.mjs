// What users of a browser grid do most, each through the grid's browser:
// a full-page screenshot, a large response body, a download, an upload, a
// trace, and a video.
import { test, expect } from '@playwright/test';
import fs from 'node:fs';

test('a full-page screenshot of a tall page', async ({ page }) => {
	await page.setContent('<body style="margin:0"><div style="height:3000px;background:linear-gradient(red,blue)"></div></body>');
	const png = await page.screenshot({ fullPage: true });
	// PNG: the signature, then the IHDR chunk with width and height
	expect(png.subarray(1, 4).toString()).toBe('PNG');
	expect(png.readUInt32BE(20)).toBeGreaterThanOrEqual(3000);
});

test('a large response body', async ({ page }) => {
	const size = 3 << 20;
	// The client answers the browser's requests: the body crosses the grid.
	await page.route('http://grid.test/**', (route) => route.request().url().endsWith('/big')
		? route.fulfill({ status: 200, contentType: 'text/plain', body: 'x'.repeat(size) })
		: route.fulfill({ status: 200, contentType: 'text/html', body: '<title>big</title>' }));
	await page.goto('http://grid.test/');
	const got = await page.evaluate(async () => (await (await fetch('/big')).text()).length);
	expect(got).toBe(size);
});

test('a download', async ({ page }, testInfo) => {
	await page.setContent('<a download="report.txt" href="data:text/plain,hello%20from%20the%20grid">get</a>');
	const [download] = await Promise.all([page.waitForEvent('download'), page.click('a')]);
	const file = testInfo.outputPath('report.txt');
	await download.saveAs(file);
	expect(fs.readFileSync(file, 'utf8')).toBe('hello from the grid');
	expect(download.suggestedFilename()).toBe('report.txt');
});

test('an upload', async ({ page }) => {
	await page.setContent('<input type="file" id="f">');
	const content = 'x'.repeat(1 << 20);
	await page.setInputFiles('#f', { name: 'up.txt', mimeType: 'text/plain', buffer: Buffer.from(content) });
	const read = await page.evaluate(() => new Promise((resolve) => {
		const r = new FileReader();
		r.onload = () => resolve(r.result.length);
		r.readAsText(document.getElementById('f').files[0]);
	}));
	expect(read).toBe(content.length);
});

test('a trace', async ({ context, page }, testInfo) => {
	await context.tracing.start({ screenshots: true, snapshots: true });
	await page.setContent('<title>traced</title><button>go</button>');
	await page.click('button');
	const file = testInfo.outputPath('trace.zip');
	await context.tracing.stop({ path: file });
	expect(fs.statSync(file).size).toBeGreaterThan(1000);
});

test('a video', async ({ browser }, testInfo) => {
	const context = await browser.newContext({ recordVideo: { dir: testInfo.outputPath('videos') } });
	const page = await context.newPage();
	await page.setContent('<title>recorded</title><h1>moving</h1>');
	await page.waitForTimeout(500);
	const video = page.video();
	await page.close();
	const file = testInfo.outputPath('video.webm');
	await video.saveAs(file);
	await context.close();
	const head = fs.readFileSync(file).subarray(0, 4);
	expect(head.equals(Buffer.from([0x1a, 0x45, 0xdf, 0xa3]))).toBe(true); // WebM (EBML)
});
