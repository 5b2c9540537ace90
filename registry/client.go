package registry

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
)

// newClient implements NewClient.
//
//	redis://[user:password@]host:port[/db][?options]
//	rediss://...                                (TLS)
//	redis+cluster://[user:password@]h1:p1,h2:p2[?options]
//	rediss+cluster://...                        (Cluster over TLS)
//	unix://[user:password@]/path/to/redis.sock[?db=N]
//
// Options are go-redis' URL options (dial_timeout, pool_size, ...).
func newClient(raw string) (redis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("parsing redis URL %q: no scheme (want redis://, rediss://, redis+cluster:// or rediss+cluster://)", RedactURL(raw))
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss", "unix":
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("parsing redis URL %q: %s", RedactURL(raw), redactErr(err, raw))
		}
		return redis.NewClient(opts), nil
	case "redis+cluster", "rediss+cluster":
		base := strings.TrimSuffix(strings.ToLower(scheme), "+cluster")
		authority, tail, _ := strings.Cut(rest, "/")
		query := ""
		if i := strings.IndexByte(authority, '?'); i >= 0 {
			authority, query = authority[:i], authority[i+1:]
		} else if i := strings.IndexByte(tail, '?'); i >= 0 {
			tail, query = tail[:i], tail[i+1:]
		}
		if tail != "" {
			return nil, fmt.Errorf("parsing redis URL %q: Redis Cluster has no databases, remove the path %q", RedactURL(raw), "/"+tail)
		}
		user := ""
		hostList := authority
		if i := strings.LastIndexByte(authority, '@'); i >= 0 {
			user, hostList = authority[:i+1], authority[i+1:]
		}
		hosts := strings.Split(hostList, ",")
		for _, h := range hosts {
			if h == "" {
				return nil, fmt.Errorf("parsing redis URL %q: empty host in the list %q", RedactURL(raw), hostList)
			}
		}
		q := url.Values{}
		if query != "" {
			var err error
			if q, err = url.ParseQuery(query); err != nil {
				return nil, fmt.Errorf("parsing redis URL %q: query: %w", RedactURL(raw), err)
			}
		}
		for _, h := range hosts[1:] {
			q.Add("addr", h)
		}
		u := base + "://" + user + hosts[0]
		if len(q) > 0 {
			u += "?" + q.Encode()
		}
		opts, err := redis.ParseClusterURL(u)
		if err != nil {
			return nil, fmt.Errorf("parsing redis URL %q: %s", RedactURL(raw), redactErr(err, raw))
		}
		return redis.NewClusterClient(opts), nil
	default:
		return nil, fmt.Errorf("parsing redis URL %q: unsupported scheme %q (want redis, rediss, redis+cluster, rediss+cluster or unix)", RedactURL(raw), scheme)
	}
}

// redactURL implements RedactURL. It works on the text rather than through
// net/url so that cluster host lists ("h1:1,h2:2") and malformed URLs are
// redacted too.
func redactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		if strings.Contains(raw, "@") {
			return "xxxxx@" + raw[strings.LastIndexByte(raw, '@')+1:]
		}
		return raw
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	authority := rest[:end]
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		userinfo := authority[:at]
		// A lone userinfo is a user name (go-redis reads it so), not a secret.
		if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
			userinfo = user + ":xxxxx"
		}
		authority = userinfo + authority[at:]
	}
	tail := rest[end:]
	if i := strings.IndexByte(tail, '?'); i >= 0 {
		q, err := url.ParseQuery(tail[i+1:])
		if err == nil && q.Has("password") {
			q.Set("password", "xxxxx")
			tail = tail[:i+1] + q.Encode()
		} else if err != nil && strings.Contains(tail[i+1:], "password") {
			tail = tail[:i+1] + "xxxxx"
		}
	}
	return scheme + "://" + authority + tail
}

// redactErr removes any secret of raw that an error message might repeat.
func redactErr(err error, raw string) string {
	msg := err.Error()
	if u, perr := url.Parse(raw); perr == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return strings.ReplaceAll(msg, raw, RedactURL(raw))
}
