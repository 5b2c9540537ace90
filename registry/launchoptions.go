package registry

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// What a Playwright client asks of a browser server on the upgrade
// request: launch options (the x-playwright-launch-options header, or
// the launch-options query parameter, JSON) and an exposeNetwork pattern
// (x-playwright-proxy, or proxy). Playwright's run-server applies some
// launch options to the browser it launches for the connection, and drops
// the rest in its safe mode; its browser server (launchServer) applies
// none. Caddy checks them against the operator's launch_options and
// expose_network; the agent refuses what its browser would ignore.
// Playwright's server never runs in its unsafe mode here: a client's
// executablePath and the like are refused, and its args (Chromium flags)
// pass only as launch_args allows, applied by the agent itself.

// LaunchRequest is what a client asked for.
type LaunchRequest struct {
	// Options are the launch options that change the browser (Applied),
	// with their JSON values, by name.
	Options map[string]json.RawMessage
	// Args are the Chromium flags asked for (the args option), each a
	// --flag or --flag=value.
	Args []string
	// Ignored are the options Playwright's server drops in its safe mode
	// (executablePath, ignoreDefaultArgs, …): a client asking for one
	// gets told no.
	Ignored []string
	// ExposeNetwork is the exposeNetwork pattern ("" none).
	ExposeNetwork string
}

// AppliedOptions are the launch options Playwright's run-server applies
// in its safe mode, beyond the grid's own (headless).
var AppliedOptions = []string{"channel", "headless", "proxy", "slowMo"}

// inertOptions change nothing a client could see: the server keeps its
// own value, or the value is the grid's (headless true).
var inertOptions = []string{"handleSIGINT", "handleSIGTERM", "handleSIGHUP", "timeout", "tracesDir", "artifactsDir", "downloadsPath"}

// maxLaunchOptions bounds the header and query a request may carry.
const maxLaunchOptions = 16 << 10

// ReadLaunchRequest reads r's launch options and exposeNetwork pattern as
// Playwright's server reads them: the query's first value, else the
// header's values joined as Node joins them. A query Go would read apart
// from Node (a ';', a bad escape) is an error, and so is anything but a
// JSON object for the launch options (Playwright's server fails on null).
func ReadLaunchRequest(r *http.Request) (LaunchRequest, error) {
	var lr LaunchRequest
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return lr, fmt.Errorf("the request's query does not parse: %v", err)
	}
	raw := q.Get("launch-options")
	if raw == "" {
		raw = strings.Join(r.Header.Values("X-Playwright-Launch-Options"), ", ")
	}
	lr.ExposeNetwork = q.Get("proxy")
	if lr.ExposeNetwork == "" {
		lr.ExposeNetwork = strings.Join(r.Header.Values("X-Playwright-Proxy"), ", ")
	}
	if len(raw) > maxLaunchOptions || len(lr.ExposeNetwork) > maxLaunchOptions {
		return lr, fmt.Errorf("the launch options or the exposeNetwork pattern are longer than %d bytes", maxLaunchOptions)
	}
	if strings.TrimSpace(raw) == "" {
		return lr, nil
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &all); err != nil || all == nil {
		return lr, fmt.Errorf("the launch options are not a JSON object: %v", orNull(err))
	}
	for k, v := range all {
		switch {
		case k == "args":
			if lr.Args, err = readArgs(v); err != nil {
				return lr, err
			}
		case k == "headless" && bytes.Equal(bytes.TrimSpace(v), []byte("true")):
		case slices.Contains(inertOptions, k):
		case slices.Contains(AppliedOptions, k):
			if lr.Options == nil {
				lr.Options = map[string]json.RawMessage{}
			}
			lr.Options[k] = v
		default:
			lr.Ignored = append(lr.Ignored, k)
		}
	}
	sort.Strings(lr.Ignored)
	return lr, nil
}

// maxArgs bounds how many flags a client may ask for.
const maxArgs = 32

// argRe is a Chromium flag as the grid takes one: two dashes, a
// lower-case name, and a value after '=' if any. Chromium reads a single
// dash as a flag too; the grid does not take that form.
var argRe = regexp.MustCompile(`^--([a-z0-9][a-z0-9-]*)(=.*)?$`)

// readArgs reads the args option: a list of flags, each well-formed.
func readArgs(v json.RawMessage) ([]string, error) {
	var args []string
	if err := json.Unmarshal(v, &args); err != nil {
		return nil, fmt.Errorf("the launch option args is not a list of strings")
	}
	if len(args) > maxArgs {
		return nil, fmt.Errorf("the launch option args holds %d flags, more than %d", len(args), maxArgs)
	}
	for _, a := range args {
		if !argRe.MatchString(a) || strings.ContainsFunc(a, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
			return nil, fmt.Errorf("the launch option args holds %q, which is no --flag or --flag=value", a)
		}
		name, value, _ := strings.Cut(a, "=")
		if v, ok := argValues[name]; ok && !v.re.MatchString(value) {
			return nil, fmt.Errorf("the launch option args holds %q: %s takes %s", a, name, v.want)
		}
	}
	return args, nil
}

// argValues are the values Chromium reads for the passable flags whose
// other values stop it as it starts.
var argValues = map[string]struct {
	re   *regexp.Regexp
	want string
}{
	"--autoplay-policy":           {regexp.MustCompile(`^(no-user-gesture-required|user-gesture-required|document-user-activation-required)$`), "no-user-gesture-required, user-gesture-required or document-user-activation-required"},
	"--font-render-hinting":       {regexp.MustCompile(`^(none|slight|medium|full)$`), "none, slight, medium or full"},
	"--window-size":               {regexp.MustCompile(`^[0-9]{1,5},[0-9]{1,5}$`), "WIDTH,HEIGHT in pixels"},
	"--window-position":           {regexp.MustCompile(`^[0-9]{1,5},[0-9]{1,5}$`), "X,Y in pixels"},
	"--force-device-scale-factor": {regexp.MustCompile(`^[0-9]{1,2}(\.[0-9]{1,3})?$`), "a number, such as 2 or 1.5"},
}

// ArgName is the name of a flag readArgs took: "--accept-lang" of
// "--accept-lang=de".
func ArgName(arg string) string {
	name, _, _ := strings.Cut(arg, "=")
	return name
}

// PassableArgs are the Chromium flags launch_args may list: each acts on
// the browser alone (its language, window, rendering, media, web
// security within the client's own pages), takes no path and opens
// nothing. Chromium has hundreds of others, among them flags that write
// files where a value says, run another program, or open a debugging
// port: a list of flags to refuse would never be complete, so the grid
// passes only these.
var PassableArgs = []string{
	"--accept-lang", "--autoplay-policy", "--blink-settings", "--disable-blink-features", "--disable-dev-shm-usage",
	"--disable-extensions", "--disable-gpu", "--disable-notifications", "--disable-popup-blocking", "--disable-web-security",
	"--font-render-hinting", "--force-color-profile", "--force-device-scale-factor", "--hide-scrollbars",
	"--ignore-certificate-errors", "--mute-audio", "--use-fake-device-for-media-stream",
	"--use-fake-ui-for-media-stream", "--user-agent", "--window-position", "--window-size",
}

// CheckArgName says why flag name (as launch_args lists it) may not be
// allowed (nil: it may).
func CheckArgName(name string) error {
	if m := argRe.FindStringSubmatch(name); m == nil || m[2] != "" {
		return fmt.Errorf("%q is no flag name: two dashes and a lower-case name, such as --accept-lang", name)
	}
	if !slices.Contains(PassableArgs, name) {
		return fmt.Errorf("%s is not a flag the grid passes to a browser; it passes only flags that act on the browser alone: %s", name, strings.Join(PassableArgs, " "))
	}
	return nil
}

// Names lists the options asked for, sorted.
func (lr LaunchRequest) Names() []string {
	out := make([]string, 0, len(lr.Options))
	for k := range lr.Options {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func orNull(err error) error {
	if err == nil {
		return errors.New("null")
	}
	return err
}
