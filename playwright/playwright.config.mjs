// The project's own Playwright Test suite, run through the grid by
// internal/localgrid's end-to-end test (TestPlaywrightTestSuite…): four
// test workers, each connecting to the grid over wss:// the way a user's
// suite does, with connectOptions from GRID_WS_ENDPOINT, or with
// PW_TEST_CONNECT_WS_ENDPOINT, which Playwright Test reads itself.
// NODE_EXTRA_CA_CERTS trusts the grid's CA. Results go to the JSON file
// GRID_RESULTS names.
import { defineConfig } from '@playwright/test';

const endpoint = process.env.GRID_WS_ENDPOINT;

export default defineConfig({
	testDir: './tests',
	workers: 4,
	fullyParallel: true,
	retries: 0,
	timeout: 60000,
	reporter: [['json', { outputFile: process.env.GRID_RESULTS || 'test-results/results.json' }], ['list']],
	outputDir: process.env.GRID_OUTPUT || 'test-results/output',
	use: {
		trace: 'off',
		...(endpoint ? { connectOptions: { wsEndpoint: endpoint, timeout: 30000 } } : {}),
	},
});
