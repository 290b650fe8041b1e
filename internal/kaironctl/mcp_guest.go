package kaironctl

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/execstream"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// What the guest tools hand back to the model: enough for a script's
// output, bounded so that a guest printing without end cannot flood the
// agent's context (or this process's memory).
const (
	mcpMaxOutput   = 256 << 10 // per stream of exec_in_machine
	mcpMaxReadFile = 1 << 20
	mcpMaxStdin    = 1 << 20
	mcpMaxFile     = 8 << 20 // write_file's content
	mcpExecTimeout = 5 * time.Minute
	truncatedMark  = "\n[... truncated by kaironctl: more output than the tool returns ...]\n"
)

func addGuestTools(server *mcp.Server, s *mcpServer) {
	mcp.AddTool(server, &mcp.Tool{
		Name: "exec_in_machine",
		Description: "Run a command in a Machine this session claimed, through its guest agent (no network needed), " +
			"and return its exit code, stdout and stderr (each cut at 256 KiB with a marker). Give claim (a claim_machine result) or machine. " +
			"The command is an argument list, run without a shell; use [\"sh\", \"-c\", \"...\"] for one.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true), OpenWorldHint: new(false)},
	}, s.execInMachine)
	mcp.AddTool(server, &mcp.Tool{
		Name:        "write_file",
		Description: "Write a file in a Machine this session claimed (created or replaced whole, with mode), through its guest agent. Give claim or machine.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true), IdempotentHint: true, OpenWorldHint: new(false)},
	}, s.writeFile)
	mcp.AddTool(server, &mcp.Tool{
		Name:        "read_file",
		Description: "Read a file from a Machine this session claimed (at most 1 MiB, cut with a marker past that), through its guest agent. Give claim or machine.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: new(false)},
	}, s.readFile)
}

// GuestTarget names the Machine a guest tool acts on.
type GuestTarget struct {
	Claim   string `json:"claim,omitempty" jsonschema:"a MachineClaim this session made (its bound Machine)"`
	Machine string `json:"machine,omitempty" jsonschema:"a Machine this session claimed, instead of claim"`
}

// ExecInMachineInput is exec_in_machine's input.
type ExecInMachineInput struct {
	GuestTarget
	Command []string `json:"command" jsonschema:"the program and its arguments, e.g. [\"python3\", \"/tmp/job.py\"]"`
	Stdin   string   `json:"stdin,omitempty" jsonschema:"text for the command's standard input (at most 1 MiB)"`
	Timeout string   `json:"timeout,omitempty" jsonschema:"kill the command after this long, a Go duration (default 5m, at most 24h)"`
}

// ExecInMachineOutput is exec_in_machine's output.
type ExecInMachineOutput struct {
	ExitCode        int    `json:"exit_code" jsonschema:"the command's exit status; 128+N when killed by signal N, 124 on timeout"`
	Signal          string `json:"signal,omitempty" jsonschema:"the signal that killed the command, if one did"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
}

// WriteFileInput is write_file's input.
type WriteFileInput struct {
	GuestTarget
	Path    string `json:"path" jsonschema:"absolute path in the guest"`
	Content string `json:"content" jsonschema:"the file's content (text, at most 8 MiB)"`
	Mode    string `json:"mode,omitempty" jsonschema:"octal permission bits, default 0644 (0755 for a script)"`
}

// WriteFileOutput is write_file's output.
type WriteFileOutput struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

// ReadFileInput is read_file's input.
type ReadFileInput struct {
	GuestTarget
	Path string `json:"path" jsonschema:"absolute path in the guest"`
}

// ReadFileOutput is read_file's output.
type ReadFileOutput struct {
	Path      string `json:"path"`
	Content   string `json:"content"`
	Truncated bool   `json:"truncated,omitempty"`
}

// guestRef resolves the tool's target, which must be this session's: a
// claim with the session label, or a Machine with it (the claimed Machine
// carries it).
func (s *mcpServer) guestRef(ctx context.Context, o *Options, t GuestTarget) (*machineRef, error) {
	switch {
	case t.Claim != "" && t.Machine != "":
		return nil, fmt.Errorf("give claim or machine, not both")
	case t.Claim != "":
		if err := s.ownsObject(ctx, o, &kaironv1.MachineClaim{}, "machineclaims", t.Claim); err != nil {
			return nil, err
		}
		return o.resolveMachine(ctx, "claim", "mc/"+t.Claim)
	case t.Machine != "":
		if err := s.ownsObject(ctx, o, &kaironv1.Machine{}, "machines", t.Machine); err != nil {
			return nil, err
		}
		return o.resolveMachine(ctx, "machine", "machine/"+t.Machine)
	}
	return nil, fmt.Errorf("give claim (a claim_machine result) or machine")
}

func (s *mcpServer) execInMachine(ctx context.Context, _ *mcp.CallToolRequest, in ExecInMachineInput) (*mcp.CallToolResult, ExecInMachineOutput, error) {
	var out bytes.Buffer
	o := s.call(&out)
	if len(in.Command) == 0 || in.Command[0] == "" {
		return nil, ExecInMachineOutput{}, mcpError(fmt.Errorf("command is empty; give the program and its arguments"))
	}
	if len(in.Stdin) > mcpMaxStdin {
		return nil, ExecInMachineOutput{}, mcpError(fmt.Errorf("stdin is %d bytes, more than the %d the tool takes", len(in.Stdin), mcpMaxStdin))
	}
	timeout, err := mcpDuration("timeout", in.Timeout, mcpExecTimeout)
	if err != nil {
		return nil, ExecInMachineOutput{}, mcpError(err)
	}
	if timeout == 0 || timeout > wire.MaxTimeoutSeconds*time.Second {
		return nil, ExecInMachineOutput{}, mcpError(fmt.Errorf("timeout must be between 1s and 24h, got %s", timeout))
	}
	ref, err := s.guestRef(ctx, o, in.GuestTarget)
	if err != nil {
		return nil, ExecInMachineOutput{}, mcpError(err)
	}
	params := url.Values{"command": in.Command, "timeout": {strconv.Itoa(int(max(timeout.Round(time.Second), time.Second) / time.Second))}}
	session := execstream.Session{}
	if in.Stdin != "" {
		params.Set("stdin", "true")
		session.Stdin = strings.NewReader(in.Stdin)
	}
	stdout, stderr := &cappedBuffer{max: mcpMaxOutput}, &cappedBuffer{max: mcpMaxOutput}
	session.Stdout, session.Stderr = stdout, stderr
	conn, err := o.openStream(ctx, ref, "exec", params, "create on machines/exec")
	if err != nil {
		return nil, ExecInMachineOutput{}, mcpError(err)
	}
	exit, err := execstream.Run(ctx, conn, session)
	if err != nil {
		return nil, ExecInMachineOutput{}, mcpError(fmt.Errorf("exec in %s: %w", ref, err))
	}
	if exit.Error != "" {
		return nil, ExecInMachineOutput{}, mcpError(fmt.Errorf("exec in %s: %s", ref, exit.Error))
	}
	res := ExecInMachineOutput{ExitCode: exit.Code, Signal: exit.Signal, TimedOut: exit.TimedOut,
		Stdout: stdout.text(), Stderr: stderr.text(), StdoutTruncated: stdout.cut, StderrTruncated: stderr.cut}
	switch {
	case exit.TimedOut:
		res.ExitCode = 124
	case exit.Signal != "":
		res.ExitCode = 128 + signalNumber(exit.Signal)
	}
	return nil, res, nil
}

func (s *mcpServer) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	var out bytes.Buffer
	o := s.call(&out)
	if !strings.HasPrefix(in.Path, "/") {
		return nil, WriteFileOutput{}, mcpError(fmt.Errorf("path %q is not absolute", in.Path))
	}
	if len(in.Content) > mcpMaxFile {
		return nil, WriteFileOutput{}, mcpError(fmt.Errorf("content is %d bytes, more than the %d write_file takes; use kaironctl cp for large files", len(in.Content), mcpMaxFile))
	}
	mode := "0644"
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m > 0o7777 {
			return nil, WriteFileOutput{}, mcpError(fmt.Errorf("mode %q is not octal permission bits such as 0644 or 0755", in.Mode))
		}
		mode = fmt.Sprintf("%04o", m)
	}
	ref, err := s.guestRef(ctx, o, in.GuestTarget)
	if err != nil {
		return nil, WriteFileOutput{}, mcpError(err)
	}
	conn, err := o.openStream(ctx, ref, "files/write", url.Values{"path": {in.Path}, "mode": {mode}}, "create on machines/exec")
	if err != nil {
		return nil, WriteFileOutput{}, mcpError(err)
	}
	exit, err := execstream.Run(ctx, conn, execstream.Session{Stdin: strings.NewReader(in.Content)})
	if err == nil {
		err = plainExit(exit, fmt.Sprintf("write to %s:%s", ref, in.Path))
	}
	if err != nil {
		return nil, WriteFileOutput{}, mcpError(err)
	}
	return nil, WriteFileOutput{Path: in.Path, Bytes: len(in.Content)}, nil
}

func (s *mcpServer) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadFileInput) (*mcp.CallToolResult, ReadFileOutput, error) {
	var out bytes.Buffer
	o := s.call(&out)
	if !strings.HasPrefix(in.Path, "/") {
		return nil, ReadFileOutput{}, mcpError(fmt.Errorf("path %q is not absolute", in.Path))
	}
	ref, err := s.guestRef(ctx, o, in.GuestTarget)
	if err != nil {
		return nil, ReadFileOutput{}, mcpError(err)
	}
	conn, err := o.openStream(ctx, ref, "files/read", url.Values{"path": {in.Path}}, "create on machines/exec")
	if err != nil {
		return nil, ReadFileOutput{}, mcpError(err)
	}
	content := &cappedBuffer{max: mcpMaxReadFile}
	exit, err := execstream.Run(ctx, conn, execstream.Session{Stdout: content})
	if err == nil {
		err = plainExit(exit, fmt.Sprintf("read from %s:%s", ref, in.Path))
	}
	if err != nil {
		return nil, ReadFileOutput{}, mcpError(err)
	}
	return nil, ReadFileOutput{Path: in.Path, Content: content.text(), Truncated: content.cut}, nil
}

// cappedBuffer keeps the first max bytes written to it and counts the
// rest away: the stream keeps flowing (the guest is never blocked on it),
// and the tool's answer stays bounded.
type cappedBuffer struct {
	buf   bytes.Buffer
	max   int
	total int
	cut   bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(room, len(p))])
	}
	b.total += len(p)
	b.cut = b.total > b.max
	return len(p), nil
}

func (b *cappedBuffer) text() string {
	if b.cut {
		return b.buf.String() + truncatedMark
	}
	return b.buf.String()
}

var _ io.Writer = (*cappedBuffer)(nil)
