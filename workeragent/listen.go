package workeragent

import (
	"context"
	"net"
	"time"

	"fmt"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// listenFront listens for proxies. Every connection it accepts gets TCP
// keepalive and a user timeout of proxyTimeout: a proxy host that vanished
// without a FIN (a crashed machine, a cut network) is found within that
// long, idle or not, and its sessions end.
func listenFront(addr string, proxyTimeout time.Duration) (net.Listener, error) {
	lc := net.ListenConfig{KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: proxyTimeout / 3, Interval: proxyTimeout / 3, Count: 2,
	}}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	return timeoutListener{ln, proxyTimeout}, nil
}

type timeoutListener struct {
	net.Listener
	timeout time.Duration
}

func (l timeoutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		setUserTimeout(tc, l.timeout)
	}
	return c, nil
}

// NewLogger builds the agent's logger on stderr in cfg's format and level.
func NewLogger(cfg Config) (*zap.Logger, error) {
	var zc zap.Config
	if cfg.LogFormat == "console" {
		zc = zap.NewDevelopmentConfig()
		zc.DisableStacktrace = true
	} else {
		zc = zap.NewProductionConfig()
		zc.Sampling = nil
		zc.EncoderConfig.TimeKey = "ts"
		zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	}
	lvl, err := zapcore.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("-log-level %q: %w", cfg.LogLevel, err)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.OutputPaths = []string{"stderr"}
	zc.ErrorOutputPaths = []string{"stderr"}
	return zc.Build()
}

// RedisLogger adapts log for go-redis' own messages, at debug level:
// redis.SetLogger(workeragent.RedisLogger(log)).
func RedisLogger(log *zap.Logger) interface {
	Printf(ctx context.Context, format string, v ...any)
} {
	return redisLogger{log.Named("redis")}
}

type redisLogger struct{ log *zap.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	if ce := l.log.Check(zapcore.DebugLevel, "redis client"); ce != nil {
		ce.Write(zap.String("detail", fmt.Sprintf(format, v...)))
	}
}
