package kaironctl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// LabelMCPSession marks the claims an MCP server created, and their
// Machines, with the server's session: its write tools act on nothing
// else. Under kairon.zyvor.dev, which kaironctl claim --label refuses, so
// an agent cannot pass it off as its own label.
const LabelMCPSession = "mcp.kairon.zyvor.dev/session"

// MCPOptions are what the operator who starts 'kaironctl mcp serve' allows
// the agent on the other end.
type MCPOptions struct {
	// AllowWrite offers the write tools.
	AllowWrite bool
	// Session labels what this server creates (default: mcp-<random>).
	Session string
	// MaxClaims bounds the session's live claims (0: no limit).
	MaxClaims int
	// DefaultTTL is given to a claim made without a TTL; MaxTTL bounds
	// the TTL a claim may ask for and, without DefaultTTL, is the default.
	DefaultTTL, MaxTTL time.Duration
	// NoRetain refuses claims that keep their Machine after release.
	NoRetain bool
	// Ceiling, when set, is the most egress a claim may allow; a claim
	// without egress gets it.
	Ceiling *kaironv1.EgressRules
}

// check validates the flags and reads the ceiling file.
func (m *MCPOptions) check(cmd *cobra.Command, ceilingFile string) error {
	if m.Session != "" {
		if errs := validation.IsValidLabelValue(m.Session); len(errs) > 0 || m.Session == "" {
			return usageError(cmd, "--session %q is not a label value: %v", m.Session, errs)
		}
	}
	switch {
	case m.MaxClaims < 0:
		return usageError(cmd, "--max-claims must not be negative, got %d", m.MaxClaims)
	case m.DefaultTTL < 0 || m.DefaultTTL%time.Second != 0:
		return usageError(cmd, "--default-ttl must be a non-negative whole number of seconds, got %s", m.DefaultTTL)
	case m.MaxTTL < 0 || m.MaxTTL%time.Second != 0:
		return usageError(cmd, "--max-ttl must be a non-negative whole number of seconds, got %s", m.MaxTTL)
	case m.MaxTTL > 0 && m.DefaultTTL > m.MaxTTL:
		return usageError(cmd, "--default-ttl %s is longer than --max-ttl %s", m.DefaultTTL, m.MaxTTL)
	}
	if !m.AllowWrite && (m.MaxClaims != 0 || m.DefaultTTL != 0 || m.MaxTTL != 0 || m.NoRetain || ceilingFile != "") {
		return usageError(cmd, "--max-claims, --default-ttl, --max-ttl, --no-retain and --egress-ceiling limit the write tools: they need --allow-write")
	}
	if ceilingFile != "" {
		data, err := os.ReadFile(ceilingFile)
		if err != nil {
			return fmt.Errorf("--egress-ceiling: %w", err)
		}
		var ceiling kaironv1.EgressRules
		if err := yaml.UnmarshalStrict(data, &ceiling); err != nil {
			return fmt.Errorf("--egress-ceiling %s: not an egress allowlist (allowFqdns, allowCidrs, allowPorts, allowSNI, allowDNS, allowIcmp): %v", ceilingFile, err)
		}
		// The ceiling must itself be a valid allowlist: a claim gets it
		// as it is when it asks for no egress.
		if err := rules.EgressWithin(ceiling, ceiling); err != nil {
			return fmt.Errorf("--egress-ceiling %s: %v", ceilingFile, err)
		}
		m.Ceiling = &ceiling
	}
	return nil
}

// vet applies the limits to a claim's spec before it is created: the TTL
// default and bound, retain, and the egress ceiling. Errors name the tool's
// input field.
func (m MCPOptions) vet(spec *kaironv1.MachineClaimSpec) error {
	ttl := time.Duration(0)
	if spec.TTLSeconds != nil {
		ttl = time.Duration(*spec.TTLSeconds) * time.Second
	}
	switch {
	case ttl == 0 && m.DefaultTTL > 0:
		spec.TTLSeconds = new(int64(m.DefaultTTL / time.Second))
	case ttl == 0 && m.MaxTTL > 0:
		spec.TTLSeconds = new(int64(m.MaxTTL / time.Second))
	case m.MaxTTL > 0 && ttl > m.MaxTTL:
		return fmt.Errorf("ttl %s is longer than this server allows (--max-ttl %s)", ttl, m.MaxTTL)
	}
	if m.NoRetain && spec.ReclaimPolicy == kaironv1.ReclaimRetain {
		return fmt.Errorf("retain is not allowed by this server (--no-retain): a released Machine is deleted")
	}
	if m.Ceiling != nil {
		if spec.Egress == nil {
			spec.Egress = m.Ceiling.DeepCopy()
		} else if err := rules.EgressWithin(*spec.Egress, *m.Ceiling); err != nil {
			return fmt.Errorf("egress reaches past what this server allows (--egress-ceiling): %v", err)
		}
	}
	return nil
}

// checkClaimCount refuses a new claim when the session holds MaxClaims.
func (s *mcpServer) checkClaimCount(ctx context.Context, o *Options) error {
	if s.opts.MaxClaims == 0 {
		return nil
	}
	c, err := o.Client()
	if err != nil {
		return err
	}
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	var claims kaironv1.MachineClaimList
	if err := c.List(ctx, &claims, client.InNamespace(ns), client.MatchingLabels{LabelMCPSession: s.opts.Session}); err != nil {
		return fmt.Errorf("counting this session's claims: %w", err)
	}
	live := 0
	for _, cl := range claims.Items {
		if cl.DeletionTimestamp == nil {
			live++
		}
	}
	if live >= s.opts.MaxClaims {
		return fmt.Errorf("this session holds %d claims, the most this server allows (--max-claims %d): release one first", live, s.opts.MaxClaims)
	}
	return nil
}

// ownsObject refuses name unless it carries this session's label: the
// write tools act only on what this server created.
func (s *mcpServer) ownsObject(ctx context.Context, o *Options, obj client.Object, kind, name string) error {
	c, err := o.Client()
	if err != nil {
		return err
	}
	ns, err := o.Namespace()
	if err != nil {
		return err
	}
	k, _ := lookupKind(kind)
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return o.objectError(k, ns, name, err)
		}
		return err
	}
	if got := obj.GetLabels()[LabelMCPSession]; got != s.opts.Session {
		return fmt.Errorf("%s/%s was not created by this MCP session (its %s label is %q, this session is %q): this server acts only on its own claims and Machines",
			k.Singular, name, LabelMCPSession, got, s.opts.Session)
	}
	return nil
}

func randomSession() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "mcp-" + hex.EncodeToString(b)
}
