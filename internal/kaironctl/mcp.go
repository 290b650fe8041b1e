package kaironctl

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func newMCPCommand(o *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve Kairon to AI agents over the Model Context Protocol",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(cmd, "unknown mcp command %q; commands: serve", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	var opts MCPOptions
	var ceilingFile string
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Run an MCP server on stdin/stdout",
		Long: `Run a Model Context Protocol server on stdin and stdout, for an AI agent
to start as a subprocess. It talks to the API server with the usual
kubeconfig flags; -n/--namespace picks the namespace the tools work in.

Tools:
  list_machine_pools  the MachinePools and their warm/ready/claimed counts (always)
  claim_machine       take a warm Machine, like 'kaironctl claim'   (--allow-write)
  release_claim       release a claim, like 'kaironctl release'     (--allow-write)
  delete_machine      delete a Machine, like 'kaironctl delete machine' (--allow-write)
  exec_in_machine     run a command in a claimed Machine, like 'kaironctl exec' (--allow-write)
  write_file          write a file in a claimed Machine, like 'kaironctl cp' (--allow-write)
  read_file           read a file from a claimed Machine, like 'kaironctl cp' (--allow-write)

Without --allow-write the server is read-only: the write tools are not
offered at all.

With --allow-write the server acts only on what it made: every claim it
creates carries the label mcp.kairon.zyvor.dev/session=SESSION (its
Machine too), and release_claim and delete_machine refuse any claim or
Machine without this server's session. --max-claims bounds the claims the
session holds at once; --default-ttl and --max-ttl bound how long a claim
lives; --no-retain refuses claims that would keep their Machine after
release; --egress-ceiling FILE (an egress allowlist, the fields of a
claim's spec.egress in YAML or JSON) is the most any claim may allow: a
claim without egress gets the ceiling itself, and one reaching past it is
refused with the field that does.`,
		Example: `  kaironctl mcp serve -n agents
  kaironctl mcp serve --allow-write --kubeconfig ~/.kube/agents -n team-a
  kaironctl mcp serve --allow-write -n sandboxes --max-claims 3 --max-ttl 2h --no-retain --egress-ceiling ceiling.yaml`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError(cmd, "serve takes no arguments, got %d", len(args))
			}
			if err := opts.check(cmd, ceilingFile); err != nil {
				return err
			}
			return NewMCPServer(o, opts).Run(cmd.Context(), &mcp.StdioTransport{})
		},
	}
	serve.Flags().BoolVar(&opts.AllowWrite, "allow-write", false, "Also offer claim_machine, release_claim, delete_machine, exec_in_machine, write_file and read_file, limited to this session's own claims and Machines")
	serve.Flags().StringVar(&opts.Session, "session", "", "Name of this server's session, the value of the "+LabelMCPSession+" label on what it creates (default: mcp-<random>)")
	serve.Flags().IntVar(&opts.MaxClaims, "max-claims", 0, "Most claims the session may hold at once (0: no limit)")
	serve.Flags().DurationVar(&opts.DefaultTTL, "default-ttl", 0, "TTL of a claim made without one (0: none, unless --max-ttl)")
	serve.Flags().DurationVar(&opts.MaxTTL, "max-ttl", 0, "Longest TTL a claim may ask for; a claim without one gets --default-ttl, else this (0: no limit)")
	serve.Flags().BoolVar(&opts.NoRetain, "no-retain", false, "Refuse claims with retain: every claimed Machine is deleted when released")
	serve.Flags().StringVar(&ceilingFile, "egress-ceiling", "", "File with the most egress any claim may allow (YAML or JSON of a claim's spec.egress)")
	cmd.AddCommand(serve)
	return cmd
}

// mcpServer runs the tools on behalf of one MCP server. Each call works on
// its own copy of the Options, with Out captured, so that nothing a verb
// prints reaches stdout (the protocol's channel) and calls may overlap.
type mcpServer struct {
	mu   sync.Mutex
	o    *Options
	opts MCPOptions
	// claimCmd is a 'kaironctl claim' command, only so that usage errors
	// read exactly as the CLI's.
	claimCmd *cobra.Command
}

// call returns a copy of the Options whose Out is out, with the clients
// built once and shared.
func (s *mcpServer) call(out *bytes.Buffer) *Options {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Errors here (a broken kubeconfig) come back from the verb itself.
	_, _ = s.o.Client()
	c := *s.o
	c.Out, c.ErrOut = out, out
	return &c
}

// NewMCPServer is the MCP server of 'kaironctl mcp serve', not yet running:
// list_machine_pools always, and with opts.AllowWrite also claim_machine,
// release_claim and delete_machine.
func NewMCPServer(o *Options, opts MCPOptions) *mcp.Server {
	root := &cobra.Command{Use: "kaironctl"}
	if opts.Session == "" {
		opts.Session = randomSession()
	}
	s := &mcpServer{o: o, opts: opts, claimCmd: newClaimCommand(o)}
	root.AddCommand(s.claimCmd)

	server := mcp.NewServer(&mcp.Implementation{Name: "kaironctl", Version: clientVersion()}, nil)
	mcp.AddTool(server, &mcp.Tool{
		Name:        "list_machine_pools",
		Description: "List the Kairon MachinePools in the namespace (or every namespace) with their desired, warm, ready-warm and claimed member counts.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.listMachinePools)
	if !opts.AllowWrite {
		return server
	}
	mcp.AddTool(server, &mcp.Tool{
		Name: "claim_machine",
		Description: "Take a warm Machine from a MachinePool: create a MachineClaim and wait until it binds. " +
			"Returns the claim, the Machine, how long the bind took and the Machine's address. Release it with release_claim when done. " +
			"The server's operator may limit how many claims this session holds, their TTL, retain, and the egress a claim may allow.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(false), OpenWorldHint: new(false)},
	}, s.claimMachine)
	mcp.AddTool(server, &mcp.Tool{
		Name: "release_claim",
		Description: "Release a MachineClaim this session made: delete it and wait until its Machine is deleted " +
			"(reclaimPolicy Delete) or kept as a plain Machine (Retain). Claims made by anyone else are refused.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true), IdempotentHint: true},
	}, s.releaseClaim)
	mcp.AddTool(server, &mcp.Tool{
		Name:        "delete_machine",
		Description: "Delete a Kairon Machine this session claimed (its VM is stopped) and wait until it is gone. Other Machines are refused.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: new(true), IdempotentHint: true},
	}, s.deleteMachine)
	addGuestTools(server, s)
	return server
}

// ListMachinePoolsInput is list_machine_pools' input.
type ListMachinePoolsInput struct {
	AllNamespaces bool `json:"all_namespaces,omitempty" jsonschema:"list the pools of every namespace instead of the configured one"`
}

// MachinePoolSummary is one pool in list_machine_pools' output.
type MachinePoolSummary struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Desired   int32  `json:"desired" jsonschema:"spec.replicas: warm members the pool keeps"`
	Warm      int32  `json:"warm" jsonschema:"unclaimed members, booted or booting"`
	ReadyWarm int32  `json:"readyWarm" jsonschema:"unclaimed Running members: what a claim can bind to now"`
	Claimed   int32  `json:"claimed" jsonschema:"members held by claims"`
}

// ListMachinePoolsOutput is list_machine_pools' output.
type ListMachinePoolsOutput struct {
	Pools []MachinePoolSummary `json:"pools"`
}

func (s *mcpServer) listMachinePools(ctx context.Context, _ *mcp.CallToolRequest, in ListMachinePoolsInput) (*mcp.CallToolResult, ListMachinePoolsOutput, error) {
	var out bytes.Buffer
	o := s.call(&out)
	k, _ := lookupKind("machinepools")
	var opts []client.ListOption
	ns := metav1.NamespaceAll
	if !in.AllNamespaces {
		var err error
		if ns, err = o.Namespace(); err != nil {
			return nil, ListMachinePoolsOutput{}, mcpError(err)
		}
		opts = append(opts, client.InNamespace(ns))
	}
	c, err := o.Client()
	if err != nil {
		return nil, ListMachinePoolsOutput{}, mcpError(err)
	}
	var pools kaironv1.MachinePoolList
	if err := c.List(ctx, &pools, opts...); err != nil {
		return nil, ListMachinePoolsOutput{}, mcpError(fmt.Errorf("listing %s%s: %w", k.Resource, k.where(ns), err))
	}
	res := ListMachinePoolsOutput{Pools: []MachinePoolSummary{}}
	for _, p := range pools.Items {
		sum := MachinePoolSummary{Namespace: p.Namespace, Name: p.Name, Warm: p.Status.Warm, ReadyWarm: p.Status.ReadyWarm, Claimed: p.Status.Claimed}
		if p.Spec.Replicas != nil {
			sum.Desired = *p.Spec.Replicas
		}
		res.Pools = append(res.Pools, sum)
	}
	return nil, res, nil
}

// ClaimMachineInput is claim_machine's input: 'kaironctl claim's flags.
type ClaimMachineInput struct {
	Pool       string            `json:"pool" jsonschema:"the MachinePool to take a warm Machine from"`
	Name       string            `json:"name,omitempty" jsonschema:"name of the claim (default POOL-claim-<6 hex digits>)"`
	Labels     map[string]string `json:"labels,omitempty" jsonschema:"labels to put on the Machine when the claim binds"`
	TTL        string            `json:"ttl,omitempty" jsonschema:"release the claim this long after it binds, a Go duration in whole seconds such as 1h or 90s (default: keep until released)"`
	Wait       string            `json:"wait,omitempty" jsonschema:"how long to wait for the bind, a Go duration (default 60s; 0s creates the claim and returns)"`
	AllowFqdns []string          `json:"allow_fqdns,omitempty" jsonschema:"host names the Machine may resolve and reach"`
	AllowSNI   []string          `json:"allow_sni,omitempty" jsonschema:"TLS server names allowed, exact or *.suffix"`
	AllowCidrs []string          `json:"allow_cidrs,omitempty" jsonschema:"destination CIDRs allowed, e.g. 10.0.0.0/8"`
	AllowPorts []string          `json:"allow_ports,omitempty" jsonschema:"destination ports or ranges allowed, e.g. 443 or 8000-8100"`
	AllowDNS   []string          `json:"allow_dns,omitempty" jsonschema:"DNS query names allowed, exact or *.suffix (default: allow_fqdns)"`
	AllowIcmp  bool              `json:"allow_icmp,omitempty" jsonschema:"allow ICMP"`
	Retain     bool              `json:"retain,omitempty" jsonschema:"keep the Machine as a plain Machine when the claim is released"`
}

// ClaimMachineOutput is claim_machine's output.
type ClaimMachineOutput struct {
	Claim      string `json:"claim"`
	Phase      string `json:"phase,omitempty" jsonschema:"the claim's phase; Bound unless wait was 0s"`
	Machine    string `json:"machine,omitempty"`
	BindMillis int64  `json:"bind_millis,omitempty" jsonschema:"milliseconds from the claim's creation to the bind"`
	Address    string `json:"address,omitempty" jsonschema:"the Machine's first address, status.addresses[0]"`
}

func (s *mcpServer) claimMachine(ctx context.Context, _ *mcp.CallToolRequest, in ClaimMachineInput) (*mcp.CallToolResult, ClaimMachineOutput, error) {
	var out bytes.Buffer
	o := s.call(&out)
	f := &claimFlags{
		wait:      60 * time.Second,
		fqdns:     in.AllowFqdns,
		snis:      in.AllowSNI,
		cidrs:     in.AllowCidrs,
		ports:     in.AllowPorts,
		dns:       in.AllowDNS,
		icmp:      in.AllowIcmp,
		retain:    in.Retain,
		name:      in.Name,
		nameGiven: in.Name != "",
	}
	for _, k := range slices.Sorted(maps.Keys(in.Labels)) {
		f.labels = append(f.labels, k+"="+in.Labels[k])
	}
	f.claimLabels = map[string]string{LabelMCPSession: s.opts.Session}
	f.machineLabels = map[string]string{LabelMCPSession: s.opts.Session}
	f.vetSpec = s.opts.vet
	var err error
	if in.TTL != "" {
		if f.ttl, err = time.ParseDuration(in.TTL); err != nil {
			return nil, ClaimMachineOutput{}, mcpError(fmt.Errorf("invalid ttl %q: %v", in.TTL, err))
		}
	}
	if in.Wait != "" {
		if f.wait, err = time.ParseDuration(in.Wait); err != nil {
			return nil, ClaimMachineOutput{}, mcpError(fmt.Errorf("invalid wait %q: %v", in.Wait, err))
		}
	}
	if err := s.checkClaimCount(ctx, o); err != nil {
		return nil, ClaimMachineOutput{}, mcpError(err)
	}
	c, err := o.claimMachine(ctx, s.claimCmd, in.Pool, f)
	if err != nil {
		return nil, ClaimMachineOutput{}, mcpError(err)
	}
	res := ClaimMachineOutput{Claim: c.Name, Phase: string(c.Status.Phase), Machine: c.Status.MachineName, BindMillis: c.Status.BindMillis}
	if res.Machine != "" {
		// The address is a convenience: a Machine that cannot be read
		// (yet) leaves it empty rather than failing a bind that happened.
		var m kaironv1.Machine
		if cl, err := o.Client(); err == nil {
			if cl.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: res.Machine}, &m) == nil && len(m.Status.Addresses) > 0 {
				res.Address = m.Status.Addresses[0].Address
			}
		}
	}
	return nil, res, nil
}

// ReleaseClaimInput is release_claim's input.
type ReleaseClaimInput struct {
	Claim   string `json:"claim" jsonschema:"name of the MachineClaim to release"`
	NoWait  bool   `json:"no_wait,omitempty" jsonschema:"return once the deletion is accepted instead of waiting for the Machine to be dealt with"`
	Timeout string `json:"timeout,omitempty" jsonschema:"how long to wait, a Go duration (default 60s; 0s waits forever)"`
}

// ReleaseClaimOutput is release_claim's output.
type ReleaseClaimOutput struct {
	Claim   string `json:"claim"`
	Machine string `json:"machine,omitempty" jsonschema:"the Machine the claim held, if it was bound"`
	// MachineResult is what became of the Machine, as kaironctl release
	// says it: "deleted", "kept (reclaimPolicy Retain)", "will be deleted
	// (reclaimPolicy Delete)".
	MachineResult string `json:"machine_result,omitempty" jsonschema:"what happened to the Machine: deleted, kept (reclaimPolicy Retain), or will be deleted (reclaimPolicy Delete) with no_wait"`
	Summary       string `json:"summary" jsonschema:"kaironctl release's output"`
}

func (s *mcpServer) releaseClaim(ctx context.Context, _ *mcp.CallToolRequest, in ReleaseClaimInput) (*mcp.CallToolResult, ReleaseClaimOutput, error) {
	var out bytes.Buffer
	o := s.call(&out)
	timeout, err := mcpDuration("timeout", in.Timeout, time.Minute)
	if err != nil {
		return nil, ReleaseClaimOutput{}, mcpError(err)
	}
	if in.Claim == "" {
		return nil, ReleaseClaimOutput{}, mcpError(fmt.Errorf("release_claim needs a claim name"))
	}
	if err := s.ownsObject(ctx, o, &kaironv1.MachineClaim{}, "machineclaims", in.Claim); err != nil {
		return nil, ReleaseClaimOutput{}, mcpError(err)
	}
	if err := o.runRelease(ctx, in.Claim, !in.NoWait, timeout); err != nil {
		return nil, ReleaseClaimOutput{}, mcpError(err)
	}
	res := ReleaseClaimOutput{Claim: in.Claim, Summary: strings.TrimSpace(out.String())}
	// runRelease's lines: "machineclaim/C released", then at most one
	// "machine/M <what happened>".
	for line := range strings.Lines(out.String()) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "machine/"); ok {
			res.Machine, res.MachineResult, _ = strings.Cut(rest, " ")
		}
	}
	return nil, res, nil
}

// DeleteMachineInput is delete_machine's input.
type DeleteMachineInput struct {
	Machine string `json:"machine" jsonschema:"name of the Machine to delete"`
	NoWait  bool   `json:"no_wait,omitempty" jsonschema:"return once the deletion is accepted instead of waiting until the Machine is gone"`
	Timeout string `json:"timeout,omitempty" jsonschema:"how long to wait, a Go duration (default 60s; 0s waits forever)"`
}

// DeleteMachineOutput is delete_machine's output.
type DeleteMachineOutput struct {
	Machine string `json:"machine"`
	Deleted bool   `json:"deleted"`
	Summary string `json:"summary" jsonschema:"kaironctl delete's output"`
}

func (s *mcpServer) deleteMachine(ctx context.Context, _ *mcp.CallToolRequest, in DeleteMachineInput) (*mcp.CallToolResult, DeleteMachineOutput, error) {
	var out bytes.Buffer
	o := s.call(&out)
	timeout, err := mcpDuration("timeout", in.Timeout, time.Minute)
	if err != nil {
		return nil, DeleteMachineOutput{}, mcpError(err)
	}
	if in.Machine == "" {
		return nil, DeleteMachineOutput{}, mcpError(fmt.Errorf("delete_machine needs a machine name"))
	}
	if err := s.ownsObject(ctx, o, &kaironv1.Machine{}, "machines", in.Machine); err != nil {
		return nil, DeleteMachineOutput{}, mcpError(err)
	}
	k, _ := lookupKind("machines")
	ns, err := o.Namespace()
	if err != nil {
		return nil, DeleteMachineOutput{}, mcpError(err)
	}
	if err := o.deleteObjects(ctx, []objectName{{kind: k, namespace: ns, name: in.Machine}}, !in.NoWait, timeout); err != nil {
		return nil, DeleteMachineOutput{}, mcpError(err)
	}
	return nil, DeleteMachineOutput{Machine: in.Machine, Deleted: true, Summary: strings.TrimSpace(out.String())}, nil
}

// mcpDuration parses an optional, non-negative duration argument.
func mcpDuration(field, s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid %s %q: %v", field, s, err)
	}
	if d < 0 {
		return 0, fmt.Errorf("%s must not be negative, got %s", field, d)
	}
	return d, nil
}

// mcpError is the tool error for err: the one line the CLI would print
// after "error: ".
func mcpError(err error) error { return fmt.Errorf("%s", oneLine(err.Error())) }
