package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path"
	"strings"
)

// The JSON messages control frames carry. Decoding is strict: an unknown
// field, a second value or a value past a limit is refused, since a new
// field means a new protocol version.

// Limits on what a message may hold.
const (
	MaxArgs        = 256
	MaxArgLen      = 4096
	MaxEnv         = 256
	MaxPathLen     = 4096
	MaxErrorLen    = 4096
	MaxAgentLen    = 128
	MaxSeedLen     = 512
	MaxDNS         = 8
	MaxAddresses   = 8
	MaxHostnameLen = 63
	// MaxUserLen bounds exec.user.
	MaxUserLen = 256
	// MaxTimeoutSeconds bounds an exec's timeout (a day).
	MaxTimeoutSeconds = 24 * 60 * 60
	// InitialWindow is how many bytes of each data stream of a session a
	// side may send before the receiver grants more (Window): the most a
	// receiver ever buffers for one stream.
	InitialWindow = 256 << 10
	// MaxWindowGrant bounds one Window message.
	MaxWindowGrant = 16 << 20
)

// Hello is the first frame each side sends on stream 0.
type Hello struct {
	// Versions are the protocol versions the sender speaks; the two sides
	// use the highest they share.
	Versions []int `json:"versions"`
	// Agent names the sender's program and version, for logs.
	Agent string `json:"agent,omitempty"`
}

// Operations a Request asks for.
const (
	OpPing      = "ping"
	OpExec      = "exec"
	OpReadFile  = "read"
	OpWriteFile = "write"
	OpConfigure = "configure"
)

// Request starts a session on a new stream. Exactly the field of its Op is
// set (none for ping).
type Request struct {
	Op        string     `json:"op"`
	Exec      *Exec      `json:"exec,omitempty"`
	File      *File      `json:"file,omitempty"`
	Configure *Configure `json:"configure,omitempty"`
}

// Exec runs a program in the guest. Its stdin arrives in Stdin frames (a
// Close ends it), its output leaves in Stdout and Stderr frames (or Stdout
// alone under a TTY), and an Exit frame ends the session.
type Exec struct {
	// Args is the program and its arguments; Args[0] is looked up in PATH.
	Args []string `json:"args"`
	// Env is NAME=value entries added to the agent's base environment.
	Env []string `json:"env,omitempty"`
	// Dir is the working directory (absolute; empty: /).
	Dir string `json:"dir,omitempty"`
	// TTY runs the program on a pseudo-terminal of Rows x Cols.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// TimeoutSeconds kills the program after that long (0: no timeout).
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	// User runs the program as user[:group], each a name or a numeric id
	// (names resolved with the guest's /etc/passwd and /etc/group); empty:
	// the image's configured user, root in the default guest. An agent
	// older than this field refuses a request that sets it.
	User string `json:"user,omitempty"`
}

// File reads (Stdout frames, then Exit) or writes (Stdin frames, Close,
// then Exit) one regular file.
type File struct {
	// Path is absolute.
	Path string `json:"path"`
	// Mode is the permission bits a written file gets (0: 0644).
	Mode uint32 `json:"mode,omitempty"`
}

// Configure sets the guest's network identity and reseeds its RNG: what a
// clone of a saved guest needs to become a new Machine.
type Configure struct {
	Hostname string `json:"hostname,omitempty"`
	// MAC is the interface's new hardware address (aa:bb:cc:dd:ee:ff): a
	// clone's NIC still has the saved guest's, which its node's tap does
	// not let through.
	MAC string `json:"mac,omitempty"`
	// Addresses are the interface's addresses, in CIDR form.
	Addresses []string `json:"addresses,omitempty"`
	Gateway   string   `json:"gateway,omitempty"`
	DNS       []string `json:"dns,omitempty"`
	// Seed is mixed into the guest's entropy pool (base64 in JSON).
	Seed []byte `json:"seed,omitempty"`
	// Boot replaces the boot nonce the agent reports (Status.Boot): a
	// clone of a saved guest gets its own, so that nothing its sibling or
	// the saved original reported counts for it.
	Boot string `json:"boot,omitempty"`
}

// Response accepts a Request (OK) or says why not; a refused session ends
// there.
type Response struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// Close ends one direction of a session's data: "stdin" (host to guest),
// "stdout" or "stderr" (guest to host).
type Close struct {
	Stream string `json:"stream"`
}

// Exit ends a session.
type Exit struct {
	// Code is the program's exit status; -1 when it was killed by Signal.
	Code     int    `json:"code"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timedOut,omitempty"`
	// Error says why a session failed outside the program (a file that
	// cannot be opened, a program not found).
	Error string `json:"error,omitempty"`
	// Status answers a ping: the guest's boot nonce and readiness.
	Status *Status `json:"status,omitempty"`
}

// Status is what a ping learns of the guest. It is how kairon-node knows a
// guest is ready: the ready marker travels on this channel, which only the
// guest's root can write, and names the boot it belongs to.
type Status struct {
	// Boot is the nonce kairon-node gave this boot (the kernel command
	// line's kairon.boot, or the last configure's Boot).
	Boot string `json:"boot,omitempty"`
	// Ready: the guest's init finished starting its services.
	Ready bool `json:"ready,omitempty"`
	// Main is the image's main process (its Entrypoint and Cmd), which
	// the guest runs once per boot; nil when the guest has none (the
	// default guest, an image without one, or an agent older than this
	// field).
	Main *MainProcess `json:"main,omitempty"`
}

// States of a MainProcess.
const (
	MainRunning = "running"
	MainExited  = "exited"
)

// MainProcess is what became of an image guest's main process.
type MainProcess struct {
	// State is MainRunning or MainExited.
	State string `json:"state"`
	// ExitCode is its exit status once exited; -1 when Signal killed it.
	ExitCode int `json:"exitCode,omitempty"`
	// Signal names the signal that killed it (KILL, TERM, SEGV, ...; SIGn
	// for one without a name here).
	Signal string `json:"signal,omitempty"`
}

// Validate checks m.
func (m *MainProcess) Validate() error {
	switch m.State {
	case MainRunning:
		if m.ExitCode != 0 || m.Signal != "" {
			return errors.New("wire: status.main: a running process has no exit code or signal")
		}
	case MainExited:
		if m.Signal != "" {
			if m.ExitCode != -1 || !validSignalName(m.Signal) {
				return fmt.Errorf("wire: status.main.signal %q: a signal name (at most 8 capitals and digits) with exitCode -1", clip(m.Signal))
			}
		} else if m.ExitCode < 0 || m.ExitCode > 255 {
			return fmt.Errorf("wire: status.main.exitCode %d: 0 to 255", m.ExitCode)
		}
	default:
		return fmt.Errorf("wire: status.main.state %q: want running or exited", clip(m.State))
	}
	return nil
}

// String says what became of the main process, for a condition or a log.
func (m *MainProcess) String() string {
	switch {
	case m.State == MainRunning:
		return "running"
	case m.Signal != "":
		return "killed by signal " + m.Signal
	}
	return fmt.Sprintf("exited with code %d", m.ExitCode)
}

// validSignalName: what a MainProcess may name a signal, since any signal
// can end it: up to 8 capitals and digits, starting with a capital.
func validSignalName(s string) bool {
	if s == "" || len(s) > 8 || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for _, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// Resize changes a TTY session's window.
type Resize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Cancel asks the guest to end a session: Signal (TERM, KILL, INT, HUP)
// goes to the program; empty means KILL.
type Cancel struct {
	Signal string `json:"signal,omitempty"`
}

// Window lets the receiver's peer send Bytes more of Stream ("stdin" from
// the host, "stdout" or "stderr" from the guest) on the frame's session.
// Each stream starts with InitialWindow; data past what was granted is a
// protocol violation.
type Window struct {
	Stream string `json:"stream"`
	Bytes  int    `json:"bytes"`
}

// Encode is the control frame carrying m on stream.
func Encode(stream uint32, m any) (Frame, error) {
	t, err := typeOf(m)
	if err != nil {
		return Frame{}, err
	}
	if v, ok := m.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return Frame{}, err
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return Frame{}, err
	}
	return Frame{Type: t, Stream: stream, Payload: b}, nil
}

func typeOf(m any) (Type, error) {
	switch m.(type) {
	case *Hello:
		return TypeHello, nil
	case *Request:
		return TypeRequest, nil
	case *Response:
		return TypeResponse, nil
	case *Close:
		return TypeClose, nil
	case *Exit:
		return TypeExit, nil
	case *Resize:
		return TypeResize, nil
	case *Cancel:
		return TypeCancel, nil
	case *Window:
		return TypeWindow, nil
	}
	return 0, fmt.Errorf("wire: %T is not a control message", m)
}

// Decode decodes and validates a control frame's message: a *Hello,
// *Request, *Response, *Close, *Exit, *Resize, *Cancel or *Window.
func Decode(f Frame) (any, error) {
	var m any
	switch f.Type {
	case TypeHello:
		m = &Hello{}
	case TypeRequest:
		m = &Request{}
	case TypeResponse:
		m = &Response{}
	case TypeClose:
		m = &Close{}
	case TypeExit:
		m = &Exit{}
	case TypeResize:
		m = &Resize{}
	case TypeCancel:
		m = &Cancel{}
	case TypeWindow:
		m = &Window{}
	default:
		return nil, fmt.Errorf("wire: %s frames carry data, not a message", f.Type)
	}
	if len(f.Payload) > MaxControlPayload {
		return nil, fmt.Errorf("%w: %s message of %d bytes", ErrTooLarge, f.Type, len(f.Payload))
	}
	dec := json.NewDecoder(bytes.NewReader(f.Payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(m); err != nil {
		return nil, fmt.Errorf("wire: %s message: %w", f.Type, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("wire: %s message: more than one JSON value", f.Type)
	}
	if v, ok := m.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Validate checks h.
func (h *Hello) Validate() error {
	if len(h.Versions) == 0 || len(h.Versions) > 16 {
		return errors.New("wire: hello.versions: 1 to 16 versions")
	}
	if len(h.Agent) > MaxAgentLen {
		return fmt.Errorf("wire: hello.agent: at most %d bytes", MaxAgentLen)
	}
	return nil
}

// Shared picks the highest version both h and this package speak.
func (h *Hello) Shared() (int, bool) {
	best := 0
	for _, v := range h.Versions {
		if v == Version && v > best {
			best = v
		}
	}
	return best, best != 0
}

// Validate checks r and the operation's own fields.
func (r *Request) Validate() error {
	set := 0
	for _, p := range []bool{r.Exec != nil, r.File != nil, r.Configure != nil} {
		if p {
			set++
		}
	}
	want := func(field string, ok bool) error {
		if !ok || set != 1 {
			return fmt.Errorf("wire: request.op %q takes request.%s and no other", r.Op, field)
		}
		return nil
	}
	switch r.Op {
	case OpPing:
		if set != 0 {
			return errors.New("wire: request.op \"ping\" takes no arguments")
		}
		return nil
	case OpExec:
		if err := want("exec", r.Exec != nil); err != nil {
			return err
		}
		return r.Exec.Validate()
	case OpReadFile, OpWriteFile:
		if err := want("file", r.File != nil); err != nil {
			return err
		}
		return r.File.Validate()
	case OpConfigure:
		if err := want("configure", r.Configure != nil); err != nil {
			return err
		}
		return r.Configure.Validate()
	}
	return fmt.Errorf("wire: request.op %q: want ping, exec, read, write or configure", clip(r.Op))
}

// Validate checks e.
func (e *Exec) Validate() error {
	if len(e.Args) == 0 || len(e.Args) > MaxArgs {
		return fmt.Errorf("wire: exec.args: 1 to %d arguments, got %d", MaxArgs, len(e.Args))
	}
	if e.Args[0] == "" {
		return errors.New("wire: exec.args[0]: the program is empty")
	}
	for i, a := range e.Args {
		if len(a) > MaxArgLen || strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("wire: exec.args[%d]: at most %d bytes, no NUL", i, MaxArgLen)
		}
	}
	if len(e.Env) > MaxEnv {
		return fmt.Errorf("wire: exec.env: at most %d entries", MaxEnv)
	}
	for i, kv := range e.Env {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || name == "" || len(kv) > MaxArgLen || strings.IndexByte(kv, 0) >= 0 {
			return fmt.Errorf("wire: exec.env[%d]: want NAME=value, at most %d bytes, no NUL", i, MaxArgLen)
		}
	}
	if e.Dir != "" {
		if err := checkPath("exec.dir", e.Dir); err != nil {
			return err
		}
	}
	if e.TimeoutSeconds < 0 || e.TimeoutSeconds > MaxTimeoutSeconds {
		return fmt.Errorf("wire: exec.timeoutSeconds: 0 to %d", MaxTimeoutSeconds)
	}
	if !e.TTY && (e.Rows != 0 || e.Cols != 0) {
		return errors.New("wire: exec.rows and exec.cols are for a TTY only")
	}
	if e.User != "" {
		if err := validUser(e.User); err != nil {
			return err
		}
	}
	return nil
}

// validUser checks exec.user: user or user:group, each part non-empty, at
// most MaxUserLen bytes, no control characters, no second colon. Whether a
// name exists is for the guest to say.
func validUser(u string) error {
	name, group, hasGroup := strings.Cut(u, ":")
	if len(u) > MaxUserLen || name == "" || (hasGroup && (group == "" || strings.Contains(group, ":"))) ||
		strings.ContainsFunc(u, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("wire: exec.user %q: want user or user:group (names or numeric ids), at most %d bytes, no control characters", clip(u), MaxUserLen)
	}
	return nil
}

// Validate checks f.
func (f *File) Validate() error {
	if err := checkPath("file.path", f.Path); err != nil {
		return err
	}
	if f.Mode&^0o7777 != 0 {
		return fmt.Errorf("wire: file.mode %o: permission bits only", f.Mode)
	}
	return nil
}

// Validate checks c.
func (c *Configure) Validate() error {
	if len(c.Hostname) > MaxHostnameLen || strings.ContainsFunc(c.Hostname, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
	}) {
		return fmt.Errorf("wire: configure.hostname %q: a DNS label (lowercase letters, digits, '-'), at most %d", clip(c.Hostname), MaxHostnameLen)
	}
	if c.MAC != "" {
		if hw, err := net.ParseMAC(c.MAC); err != nil || len(hw) != 6 || hw[0]&1 != 0 {
			return fmt.Errorf("wire: configure.mac %q: want a unicast Ethernet address (aa:bb:cc:dd:ee:ff)", clip(c.MAC))
		}
	}
	if len(c.Addresses) > MaxAddresses {
		return fmt.Errorf("wire: configure.addresses: at most %d", MaxAddresses)
	}
	for i, a := range c.Addresses {
		if _, err := netip.ParsePrefix(a); err != nil {
			return fmt.Errorf("wire: configure.addresses[%d] %q: want an address in CIDR form", i, clip(a))
		}
	}
	if c.Gateway != "" {
		if _, err := netip.ParseAddr(c.Gateway); err != nil {
			return fmt.Errorf("wire: configure.gateway %q: want an IP address", clip(c.Gateway))
		}
	}
	if len(c.DNS) > MaxDNS {
		return fmt.Errorf("wire: configure.dns: at most %d", MaxDNS)
	}
	for i, d := range c.DNS {
		if _, err := netip.ParseAddr(d); err != nil {
			return fmt.Errorf("wire: configure.dns[%d] %q: want an IP address", i, clip(d))
		}
	}
	if len(c.Seed) > MaxSeedLen {
		return fmt.Errorf("wire: configure.seed: at most %d bytes", MaxSeedLen)
	}
	if err := validBoot("configure.boot", c.Boot); err != nil {
		return err
	}
	return nil
}

// MaxBootLen bounds a boot nonce.
const MaxBootLen = 64

// validBoot checks a boot nonce: at most MaxBootLen letters and digits.
func validBoot(field, b string) error {
	if len(b) > MaxBootLen || strings.ContainsFunc(b, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) {
		return fmt.Errorf("wire: %s %q: at most %d letters and digits", field, clip(b), MaxBootLen)
	}
	return nil
}

// Validate checks r.
func (r *Response) Validate() error {
	if r.OK && r.Error != "" {
		return errors.New("wire: response: ok with an error")
	}
	if !r.OK && r.Error == "" {
		return errors.New("wire: response: refused without a reason")
	}
	if len(r.Error) > MaxErrorLen {
		return fmt.Errorf("wire: response.error: at most %d bytes", MaxErrorLen)
	}
	return nil
}

// Validate checks c.
func (c *Close) Validate() error {
	switch c.Stream {
	case "stdin", "stdout", "stderr":
		return nil
	}
	return fmt.Errorf("wire: close.stream %q: want stdin, stdout or stderr", clip(c.Stream))
}

// Validate checks e.
func (e *Exit) Validate() error {
	if e.Code < -1 || e.Code > 255 {
		return fmt.Errorf("wire: exit.code %d: -1 to 255", e.Code)
	}
	if e.Signal != "" && !validSignal(e.Signal) {
		return fmt.Errorf("wire: exit.signal %q: a signal name such as KILL", clip(e.Signal))
	}
	if len(e.Error) > MaxErrorLen {
		return fmt.Errorf("wire: exit.error: at most %d bytes", MaxErrorLen)
	}
	if e.Status != nil {
		if err := validBoot("exit.status.boot", e.Status.Boot); err != nil {
			return err
		}
		if e.Status.Main != nil {
			if err := e.Status.Main.Validate(); err != nil {
				return err
			}
		}
	}
	return nil
}

// Validate checks r.
func (r *Resize) Validate() error {
	if r.Rows == 0 || r.Cols == 0 {
		return errors.New("wire: resize: rows and cols must be positive")
	}
	return nil
}

// Validate checks c.
func (c *Cancel) Validate() error {
	if c.Signal != "" && !validSignal(c.Signal) {
		return fmt.Errorf("wire: cancel.signal %q: want TERM, KILL, INT or HUP", clip(c.Signal))
	}
	return nil
}

// Validate checks w.
func (w *Window) Validate() error {
	if err := (&Close{Stream: w.Stream}).Validate(); err != nil {
		return fmt.Errorf("wire: window.stream %q: want stdin, stdout or stderr", clip(w.Stream))
	}
	if w.Bytes <= 0 || w.Bytes > MaxWindowGrant {
		return fmt.Errorf("wire: window.bytes %d: 1 to %d", w.Bytes, MaxWindowGrant)
	}
	return nil
}

func validSignal(s string) bool {
	switch s {
	case "TERM", "KILL", "INT", "HUP", "QUIT", "SEGV", "ABRT", "PIPE", "USR1", "USR2", "ALRM":
		return true
	}
	return false
}

func checkPath(field, p string) error {
	if len(p) > MaxPathLen || !path.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("wire: %s %q: an absolute path of at most %d bytes, no NUL", field, clip(p), MaxPathLen)
	}
	return nil
}

// clip keeps what a peer sent short in an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
