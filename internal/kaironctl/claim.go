package kaironctl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// claimFlags are kaironctl claim's flags, as typed.
type claimFlags struct {
	labels    []string
	ttl       time.Duration
	wait      time.Duration
	fqdns     []string
	snis      []string
	cidrs     []string
	ports     []string
	dns       []string
	icmp      bool
	retain    bool
	name      string
	output    string
	nameGiven bool
	// Set by the MCP server, not by flags: labels on the claim object and
	// on its Machine, and a last check of the spec before it is created.
	claimLabels   map[string]string
	machineLabels map[string]string
	vetSpec       func(*kaironv1.MachineClaimSpec) error

	// template is -o jsonpath's, parsed with the other flags.
	template *jsonpath.JSONPath
}

// claimFlagOfField names the flag that set a spec field, so a refusal by the
// API server can point at what the user typed.
var claimFlagOfField = []struct{ field, flag string }{
	{"spec.egress.allowFqdns", "--allow-fqdn"},
	{"spec.egress.allowSNI", "--allow-sni"},
	{"spec.egress.allowCidrs", "--allow-cidr"},
	{"spec.egress.allowPorts", "--allow-port"},
	{"spec.egress.allowDNS", "--allow-dns"},
	{"spec.egress.allowIcmp", "--allow-icmp"},
	{"spec.labels", "--label"},
	{"spec.ttlSeconds", "--ttl"},
	{"spec.reclaimPolicy", "--retain"},
	{"spec.poolName", "POOL"},
	{"metadata.name", "--name"},
}

// maxClaimName is the longest claim name a bind can work with: the name
// becomes the value of the kairon.zyvor.dev/machineclaim label on the
// Machine, and label values are at most 63 characters.
const maxClaimName = validation.LabelValueMaxLength

func newClaimCommand(o *Options) *cobra.Command {
	f := &claimFlags{}
	cmd := &cobra.Command{
		Use:   "claim POOL",
		Short: "Take a warm Machine from a MachinePool",
		Long: `Create a MachineClaim on the pool POOL and wait until kairon-controller binds
it to one of the pool's Running warm Machines, then print

  machineclaim/CLAIM bound to machine/MACHINE in Nms

where N is the claim's status.bindMillis (creation to bind).

If the claim has not bound after --wait, kaironctl exits with an error that
quotes the claim's status.message. The claim is left in place and still binds
once a warm Machine is ready; release it with 'kaironctl release CLAIM'.
--wait 0 creates the claim and returns at once.

--allow-* confine the claimed Machine's egress to what they list
(spec.egress); every one of them may be repeated.`,
		Example: `  kaironctl claim agents
  kaironctl claim agents --label team=ml --ttl 1h
  kaironctl claim agents --allow-fqdn pypi.org --allow-fqdn files.pythonhosted.org --allow-port 443
  kaironctl claim agents --name job-43 --retain --wait 0`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError(cmd, "claim needs exactly one POOL, got %d arguments", len(args))
			}
			f.nameGiven = cmd.Flags().Changed("name")
			return o.runClaim(cmd, args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.labels, "label", nil, "Label KEY=VALUE to put on the Machine when the claim binds (repeatable)")
	fl.DurationVar(&f.ttl, "ttl", 0, "Release the claim this long after it binds, e.g. 1h (whole seconds; 0 keeps it until released)")
	fl.DurationVar(&f.wait, "wait", 60*time.Second, "How long to wait for the bind; 0 creates the claim and returns")
	fl.StringArrayVar(&f.fqdns, "allow-fqdn", nil, "Host name the Machine may resolve and reach, or *.suffix for every name below suffix (repeatable)")
	fl.StringArrayVar(&f.snis, "allow-sni", nil, "TLS server name allowed, exact or *.suffix (repeatable)")
	fl.StringArrayVar(&f.cidrs, "allow-cidr", nil, "Destination CIDR allowed, e.g. 10.0.0.0/8 (repeatable)")
	fl.StringArrayVar(&f.ports, "allow-port", nil, "Destination port or range allowed, e.g. 443 or 8000-8100 (repeatable)")
	fl.StringArrayVar(&f.dns, "allow-dns", nil, "DNS query name allowed, exact or *.suffix (repeatable; default: the --allow-fqdn names)")
	fl.BoolVar(&f.icmp, "allow-icmp", false, "Allow ICMP")
	fl.BoolVar(&f.retain, "retain", false, "Keep the Machine as a plain Machine when the claim is released (reclaimPolicy Retain)")
	fl.StringVar(&f.name, "name", "", "Name of the claim (default POOL-claim-<6 hex digits>)")
	fl.StringVarP(&f.output, "output", "o", "", "Print the claim as json, yaml, name (machineclaim/NAME) or jsonpath=TEMPLATE instead of the bound line")
	fl.Lookup("wait").DefValue = "60s" // not pflag's "1m0s"
	return cmd
}

// claimSpec turns the flags into a MachineClaim spec, or explains which flag
// is wrong. It talks to nobody, so a bad flag creates nothing.
func claimSpec(cmd *cobra.Command, pool string, f *claimFlags) (*kaironv1.MachineClaimSpec, error) {
	spec := &kaironv1.MachineClaimSpec{PoolName: pool}
	if pool == "" {
		return nil, usageError(cmd, "POOL must not be empty")
	}
	for _, kv := range f.labels {
		key, value, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, usageError(cmd, "--label %q is not KEY=VALUE", kv)
		}
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, usageError(cmd, "--label %q: invalid key %q: %s", kv, key, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(value); len(errs) > 0 {
			return nil, usageError(cmd, "--label %q: invalid value %q: %s", kv, value, strings.Join(errs, "; "))
		}
		if prefix, _, ok := strings.Cut(key, "/"); ok && (prefix == kaironv1.GroupVersion.Group || strings.HasSuffix(prefix, "."+kaironv1.GroupVersion.Group)) {
			return nil, usageError(cmd, "--label %q: the %s/ prefix is reserved for Kairon's own labels", kv, prefix)
		}
		if old, dup := spec.Labels[key]; dup && old != value {
			return nil, usageError(cmd, "--label %s is given twice, as %q and %q", key, old, value)
		}
		if spec.Labels == nil {
			spec.Labels = map[string]string{}
		}
		spec.Labels[key] = value
	}
	switch {
	case f.ttl < 0:
		return nil, usageError(cmd, "--ttl must not be negative, got %s", f.ttl)
	case f.ttl%time.Second != 0:
		return nil, usageError(cmd, "--ttl must be a whole number of seconds, got %s", f.ttl)
	case f.ttl > 0:
		spec.TTLSeconds = new(int64(f.ttl / time.Second))
	}
	if f.wait < 0 {
		return nil, usageError(cmd, "--wait must not be negative, got %s", f.wait)
	}
	if f.retain {
		spec.ReclaimPolicy = kaironv1.ReclaimRetain
	}
	egress := &kaironv1.EgressRules{
		AllowFqdns: uniqueAs[kaironv1.Hostname](f.fqdns),
		AllowSNI:   uniqueAs[kaironv1.ServerName](f.snis),
		AllowCidrs: uniqueAs[kaironv1.CIDR](f.cidrs),
		AllowPorts: uniqueAs[kaironv1.PortRange](f.ports),
		AllowDNS:   uniqueAs[kaironv1.ServerName](f.dns),
		AllowIcmp:  f.icmp,
	}
	if len(egress.AllowFqdns)+len(egress.AllowSNI)+len(egress.AllowCidrs)+len(egress.AllowPorts)+len(egress.AllowDNS) > 0 || egress.AllowIcmp {
		spec.Egress = egress
	}
	if f.nameGiven {
		if f.name == "" {
			return nil, usageError(cmd, "--name must not be empty")
		}
		if errs := validation.IsDNS1123Subdomain(f.name); len(errs) > 0 {
			return nil, usageError(cmd, "--name %q is not a valid object name: %s", f.name, strings.Join(errs, "; "))
		}
		if len(f.name) > maxClaimName {
			return nil, usageError(cmd, "--name %q is longer than %d characters (a claim's name becomes the value of the %s label on its Machine)", f.name, maxClaimName, kaironv1.LabelMachineClaim)
		}
	}
	switch {
	case f.output == "", f.output == outputJSON, f.output == outputYAML, f.output == outputName:
	case f.output == outputJSONPath || strings.HasPrefix(f.output, outputJSONPath+"="):
		_, tmpl, err := parseOutput(f.output)
		if err != nil {
			return nil, usageError(cmd, "%v", err)
		}
		f.template = tmpl
	default:
		return nil, usageError(cmd, "unknown output format %q for -o/--output; claim prints json, yaml, name or jsonpath=TEMPLATE (or, without -o, the bound line)", f.output)
	}
	return spec, nil
}

// uniqueAs converts flag values to an API list type, dropping repeats
// (the API's lists are sets and refuse duplicates).
func uniqueAs[T ~string](values []string) []T {
	var out []T
	seen := map[string]bool{}
	for _, v := range values {
		if !seen[v] {
			seen[v] = true
			out = append(out, T(v))
		}
	}
	return out
}

// generatedClaimName is POOL-claim-<6 hex digits>, with the pool's part cut
// short when the whole would not fit in a label value.
func generatedClaimName(pool string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	suffix := "-claim-" + hex.EncodeToString(b)
	if max := maxClaimName - len(suffix); len(pool) > max {
		pool = strings.TrimRight(pool[:max], ".-")
	}
	return pool + suffix
}

func (o *Options) runClaim(cmd *cobra.Command, pool string, f *claimFlags) error {
	claimKind, _ := lookupKind("machineclaims")
	c, err := o.claimMachine(cmd.Context(), cmd, pool, f)
	if err != nil {
		return err
	}
	if f.output != "" {
		return o.printClaim(c, f)
	}
	if f.wait == 0 {
		fmt.Fprintf(o.Out, "%s created\n", claimKind.ref(c.Name))
		return nil
	}
	fmt.Fprintf(o.Out, "%s bound to machine/%s in %dms\n", claimKind.ref(c.Name), c.Status.MachineName, c.Status.BindMillis)
	return nil
}

// claimMachine creates the claim the flags describe and, unless f.wait is
// 0, waits for it to bind. It returns the claim as created (f.wait 0) or as
// bound; cmd only names the command in usage errors.
func (o *Options) claimMachine(ctx context.Context, cmd *cobra.Command, pool string, f *claimFlags) (*kaironv1.MachineClaim, error) {
	spec, err := claimSpec(cmd, pool, f)
	if err != nil {
		return nil, err
	}
	for k, v := range f.machineLabels {
		if spec.Labels == nil {
			spec.Labels = map[string]string{}
		}
		spec.Labels[k] = v
	}
	if f.vetSpec != nil {
		if err := f.vetSpec(spec); err != nil {
			return nil, err
		}
	}
	ns, err := o.Namespace()
	if err != nil {
		return nil, err
	}
	c, err := o.Client()
	if err != nil {
		return nil, err
	}
	claimKind, _ := lookupKind("machineclaims")
	poolKind, _ := lookupKind("machinepools")

	// A claim on a pool that does not exist would wait for nothing. Only a
	// definite "not found" stops here: someone allowed to create claims but
	// not to read pools still gets to try.
	switch err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: pool}, &kaironv1.MachinePool{}); {
	case apierrors.IsNotFound(err):
		return nil, o.objectError(poolKind, ns, pool, err)
	case meta.IsNoMatchError(err):
		return nil, err
	}

	claim, err := o.createClaim(ctx, c, ns, pool, spec, f)
	if err != nil {
		return nil, err
	}
	if f.wait == 0 {
		return claim, nil
	}
	bound, err := waitForWritten(ctx, c, claim, f.wait, claimBound)
	if err != nil {
		return nil, claimWaitError(claimKind, ns, claim.Name, f.wait, bound, err)
	}
	return bound, nil
}

// printClaim prints the claim as the server has it, as `get -o` would:
// json, yaml, name (machineclaim/NAME, which exec, cp, logs and release
// take) or jsonpath.
func (o *Options) printClaim(c *kaironv1.MachineClaim, f *claimFlags) error {
	if f.output == outputName {
		claimKind, _ := lookupKind("machineclaims")
		_, err := fmt.Fprintln(o.Out, claimKind.ref(c.Name))
		return err
	}
	obj, err := printable(c, kaironv1.GroupVersion.WithKind("MachineClaim"))
	if err != nil {
		return err
	}
	switch {
	case f.template != nil:
		return printJSONPath(o.Out, f.template, obj)
	case f.output == outputJSON:
		return printJSON(o.Out, obj)
	}
	return printYAML(o.Out, obj)
}

// Errors that end a wait for a bind early.
var (
	errClaimLost    = errors.New("claim is Lost")
	errClaimDeleted = errors.New("claim was deleted")
)

// claimBound is the condition claim --wait waits for: the claim Bound to
// a Machine. A Lost or deleted claim ends the wait with an error.
func claimBound(c *kaironv1.MachineClaim) (bool, error) {
	switch {
	case c == nil:
		return false, errClaimDeleted
	case c.Status.Phase == kaironv1.ClaimBound && c.Status.MachineName != "":
		return true, nil
	case c.Status.Phase == kaironv1.ClaimLost:
		return false, errClaimLost
	}
	return false, nil
}

// claimWaitError explains why kaironctl stopped waiting for a bind, in one
// line that quotes the claim's own status message and says how to get rid
// of the claim, which is left in place.
func claimWaitError(k *Kind, ns, name string, timeout time.Duration, last *kaironv1.MachineClaim, err error) error {
	var st kaironv1.MachineClaimStatus
	if last != nil {
		st = last.Status
	}
	release := "kaironctl release " + name
	if ns != metav1.NamespaceDefault {
		release += " -n " + ns
	}
	switch {
	case errors.Is(err, errClaimDeleted):
		return fmt.Errorf("%s was deleted before it bound", k.ref(name))
	case errors.Is(err, errClaimLost):
		msg := fmt.Sprintf("%s is Lost", k.ref(name))
		if st.MachineName != "" {
			msg += fmt.Sprintf(" (machine/%s)", st.MachineName)
		}
		if st.Message != "" {
			msg += ": " + st.Message
		}
		return fmt.Errorf("%s; release it with '%s'", msg, release)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		var why string
		switch {
		case st.Phase == "":
			why = "it has no status yet (is kairon-controller running?)"
		case st.Message != "":
			why = st.Message
		default:
			why = "kairon-controller gave no reason"
		}
		phase := string(st.Phase)
		if phase == "" {
			phase = "not bound"
		}
		after := fmt.Sprintf("after %gs", timeout.Seconds())
		if errors.Is(err, context.Canceled) {
			after = "when kaironctl was interrupted"
		}
		return fmt.Errorf("%s still %s %s: %s; the claim is left in place and binds as soon as a warm machine is Running: release it with '%s'",
			k.ref(name), phase, after, why, release)
	}
	return fmt.Errorf("waiting for %s%s to bind (the claim is left in place: release it with '%s'): %w", k.ref(name), k.where(ns), release, err)
}

// claimCreateError rewrites a refused create. A validation error becomes one
// line naming each offending field and, where one set it, the flag.
func claimCreateError(k *Kind, ns, name string, err error) error {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.Status().Details == nil || len(status.Status().Details.Causes) == 0 {
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s %q already exists%s (pick another --name)", k.Singular, name, k.where(ns))
		}
		return fmt.Errorf("creating %s %q%s: %w", k.Singular, name, k.where(ns), err)
	}
	var parts []string
	for _, c := range status.Status().Details.Causes {
		part := c.Message
		if c.Field != "" {
			field := c.Field
			for _, m := range claimFlagOfField {
				if field == m.field || strings.HasPrefix(field, m.field+"[") || strings.HasPrefix(field, m.field+".") {
					field += " (" + m.flag + ")"
					break
				}
			}
			part = field + ": " + c.Message
		}
		parts = append(parts, part)
	}
	return fmt.Errorf("%s %q is invalid: %s", k.Singular, name, strings.Join(parts, "; "))
}
