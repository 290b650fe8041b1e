package execstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// Protocol is the Upgrade token.
const Protocol = "kairon-exec.v1"

// StreamID is the one stream a connection carries.
const StreamID = 1

// Writer writes frames on a connection; safe for concurrent use.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
}

// NewWriter writes frames to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Send writes control message m.
func (w *Writer) Send(m any) error {
	f, err := wire.Encode(StreamID, m)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return wire.WriteFrame(w.w, f)
}

// Data writes p as data frames of type t.
func (w *Writer) Data(t wire.Type, p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return wire.WriteData(w.w, t, StreamID, p)
}

// DataWriter is an io.Writer of data frames of one type.
func (w *Writer) DataWriter(t wire.Type) io.Writer { return dataWriter{w, t} }

type dataWriter struct {
	w *Writer
	t wire.Type
}

func (d dataWriter) Write(p []byte) (int, error) {
	if err := d.w.Data(d.t, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// StatusError is a node's refusal before the upgrade.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("node agent answered %d: %s", e.Code, e.Message)
}

// ParamsHeader carries a request's parameters, encoded as a query string,
// instead of the URL's query: the API server's node proxy drops the query
// of an upgrade request, and passes headers through. A node takes the
// header when it is there, else the query.
const ParamsHeader = "X-Kairon-Params"

// Upgrade sends a POST to url through rt (which must speak HTTP/1.1 only)
// with params in ParamsHeader, asking for the upgrade, and returns the
// connection once the node answered 101. A refusal is a *StatusError.
func Upgrade(ctx context.Context, rt http.RoundTripper, url string, params url.Values) (io.ReadWriteCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", Protocol)
	if len(params) > 0 {
		req.Header.Set(ParamsHeader, params.Encode())
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, &StatusError{Code: resp.StatusCode, Message: strings.TrimSpace(string(msg))}
	}
	conn, ok := resp.Body.(io.ReadWriteCloser)
	if !ok || !strings.EqualFold(resp.Header.Get("Upgrade"), Protocol) {
		resp.Body.Close()
		return nil, fmt.Errorf("the node answered 101 without a %s stream", Protocol)
	}
	return conn, nil
}

// Params are r's parameters: ParamsHeader if set, else the URL's query.
func Params(r *http.Request) (url.Values, error) {
	if h := r.Header.Get(ParamsHeader); h != "" {
		return url.ParseQuery(h)
	}
	return r.URL.Query(), nil
}

// IsUpgrade tells whether r asks for this protocol.
func IsUpgrade(r *http.Request) bool {
	if !strings.EqualFold(r.Header.Get("Upgrade"), Protocol) {
		return false
	}
	for _, v := range r.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

// Session is what a client sends and where it takes what it receives.
type Session struct {
	// Stdin, if set, is sent then closed; nil sends Close at once.
	Stdin io.Reader
	// Stdout and Stderr take the output (nil: dropped).
	Stdout, Stderr io.Writer
	// Resize, if set, sends each window size (a TTY session).
	Resize <-chan wire.Resize
}

// ErrNoExit is a connection that ended before the node sent Exit.
var ErrNoExit = errors.New("the node closed the stream before the session ended")

// Run runs s on conn until the node's Exit, which it returns. When ctx
// ends first it sends Cancel, closes conn and returns ctx's error. conn is
// closed when Run returns.
func Run(ctx context.Context, conn io.ReadWriteCloser, s Session) (*wire.Exit, error) {
	defer conn.Close()
	w := NewWriter(conn)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			_ = w.Send(&wire.Cancel{Signal: "KILL"})
			conn.Close()
		case <-done:
		}
	}()
	go func() {
		if s.Stdin != nil {
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Stdin.Read(buf)
				if n > 0 {
					if w.Data(wire.TypeStdin, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					break
				}
			}
		}
		_ = w.Send(&wire.Close{Stream: "stdin"})
	}()
	if s.Resize != nil {
		go func() {
			for {
				select {
				case <-done:
					return
				case r, ok := <-s.Resize:
					if !ok {
						return
					}
					if r.Rows > 0 && r.Cols > 0 {
						_ = w.Send(&r)
					}
				}
			}
		}()
	}
	stdout, stderr := s.Stdout, s.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	fr := wire.NewReader(bufio.NewReaderSize(conn, 64<<10))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, ErrNoExit
			}
			return nil, err
		}
		if f.Stream != StreamID {
			return nil, fmt.Errorf("the node sent a frame on stream %d", f.Stream)
		}
		switch f.Type {
		case wire.TypeStdout:
			if _, err := stdout.Write(f.Payload); err != nil {
				return nil, err
			}
		case wire.TypeStderr:
			if _, err := stderr.Write(f.Payload); err != nil {
				return nil, err
			}
		case wire.TypeExit:
			m, err := wire.Decode(f)
			if err != nil {
				return nil, err
			}
			return m.(*wire.Exit), nil
		default:
			return nil, fmt.Errorf("the node sent an unexpected frame (type %d)", f.Type)
		}
	}
}
