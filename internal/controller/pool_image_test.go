package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/random"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/kaironctl"
	"github.com/zyvor/kairon/internal/testenv"
)

// pushRandom pushes a new random image to reg as repoTag and returns its
// digest: the pool only resolves digests, so no guest needs to boot it.
func pushRandom(t *testing.T, reg *testenv.Registry, repoTag string) string {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	return reg.Push(t, repoTag, img)
}

// pullSecret creates a kubernetes.io/dockerconfigjson Secret for the
// registry at host.
func pullSecret(t *testing.T, env *testenv.Env, ns, name, host, user, password string) {
	t.Helper()
	config, err := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{"username": user, "password": password}}})
	if err != nil {
		t.Fatal(err)
	}
	env.Create(t, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: config},
	})
}

func createImagePool(t *testing.T, env *testenv.Env, ns, name, image string, replicas int32, mutate ...func(*kaironv1.MachinePool)) {
	t.Helper()
	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To(replicas), Template: poolTemplate()},
	}
	pool.Spec.Template.Spec.Image = image
	for _, f := range mutate {
		f(pool)
	}
	env.Create(t, pool)
}

// membersByImage is "image: warm names / claimed names" of a pool's live
// members, for a failure's message.
func membersByImage(warm, claimed []kaironv1.Machine) string {
	var parts []string
	for _, m := range warm {
		parts = append(parts, fmt.Sprintf("%s(warm,%s,%s)", m.Name, m.Labels[kaironv1.LabelMachinePoolTemplateHash], m.Spec.Image))
	}
	for _, m := range claimed {
		parts = append(parts, fmt.Sprintf("%s(claimed,%s,%s)", m.Name, m.Labels[kaironv1.LabelMachinePoolTemplateHash], m.Spec.Image))
	}
	return strings.Join(parts, " ")
}

// waitPoolImage waits until pool has want warm members, all running image,
// and claimed claimed ones, and its status.image and ImageResolved
// condition say it pinned digest.
func waitPoolImage(t *testing.T, env *testenv.Env, ns, pool, image, digest, reason string, want, claimed int) []kaironv1.Machine {
	t.Helper()
	var warm []kaironv1.Machine
	eventually(t, fmt.Sprintf("pool %s to have %d warm members running %s", pool, want, image), func() (bool, string) {
		var c []kaironv1.Machine
		warm, c = poolMachines(t, env, ns, pool)
		p := getPool(t, env, ns, pool)
		ok := len(warm) == want && len(c) == claimed
		for _, m := range warm {
			ok = ok && m.Spec.Image == image
		}
		s := p.Status.Image
		cond := meta.FindStatusCondition(p.Status.Conditions, kaironv1.ConditionImageResolved.String())
		ok = ok && s != nil && s.Digest == digest && s.TemplateHash == templateHash(&p.Spec.Template) &&
			s.Reference == p.Spec.Template.Spec.Image && cond != nil && cond.Status == metav1.ConditionTrue && cond.Reason == reason
		return ok, membersByImage(warm, c) + " status " + fmtJSON(p.Status)
	})
	return warm
}

func runAll(t *testing.T, env *testenv.Env, machines []kaironv1.Machine) {
	t.Helper()
	for i := range machines {
		if machines[i].Status.Phase != kaironv1.MachineRunning {
			setMachinePhase(t, env, &machines[i], kaironv1.MachineRunning)
		}
	}
}

// kctl runs kaironctl against env's API server and returns its stdout.
func kctl(t *testing.T, env *testenv.Env, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if code := kaironctl.Main(ctx, append([]string{"--kubeconfig", env.Kubeconfig}, args...), &stdout, &stderr); code != 0 || stderr.Len() > 0 {
		t.Fatalf("kaironctl %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// A pool pins its members to the digest its template's tag named when the
// template was new: the tag moving changes neither the members it has nor
// those it creates afterwards. kaironctl rollout restart makes a new
// template, so the pool asks the registry again and its warm members roll
// to the new digest; the claimed member keeps the old one.
func TestPoolPinsItsImageUntilRolloutRestart(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	first := pushRandom(t, reg, "team/app:1")
	createNode(t, env, ns, "n1", 16, "16Gi")
	startControllers(t, env, ns, Options{})
	ref := reg.Ref("team/app:1")
	createImagePool(t, env, ns, "agents", ref, 2)

	warm := waitPoolImage(t, env, ns, "agents", ref+"@"+first, first, kaironv1.ImageReasonResolved, 2, 0)
	p := getPool(t, env, ns, "agents")
	if at := p.Status.Image.ResolvedAt; at == nil || time.Since(at.Time) > time.Hour || time.Since(at.Time) < -time.Minute {
		t.Errorf("status.image.resolvedAt = %v, want about now", at)
	}
	runAll(t, env, warm)
	createClaim(t, env, ns, "job", "agents")
	claimedName := waitClaimBound(t, env, ns, "job").Status.MachineName

	moved := pushRandom(t, reg, "team/app:1")
	if moved == first {
		t.Fatal("the tag did not move")
	}
	// The claim's replacement, and those of a scale-up, come after the
	// move: they still run the first digest.
	scalePool(t, env, ns, "agents", 3)
	warm = waitPoolImage(t, env, ns, "agents", ref+"@"+first, first, kaironv1.ImageReasonResolved, 3, 1)
	if c := getMachine(t, env, ns, claimedName); c.Spec.Image != ref+"@"+first {
		t.Errorf("claimed member runs %s, want %s", c.Spec.Image, ref+"@"+first)
	}
	runAll(t, env, warm)
	before := names(warm)
	oldHash := p.Status.Image.TemplateHash

	if out := kctl(t, env, "-n", ns, "rollout", "restart", "machinepool", "agents"); out != "machinepool/agents restarted\n" {
		t.Errorf("rollout restart printed %q", out)
	}
	p = getPool(t, env, ns, "agents")
	if p.Spec.Template.Metadata.Annotations[kaironv1.AnnotationRestartedAt] == "" {
		t.Fatalf("rollout restart left no %s on the template: %v", kaironv1.AnnotationRestartedAt, p.Spec.Template.Metadata.Annotations)
	}
	warm = waitPoolImage(t, env, ns, "agents", ref+"@"+moved, moved, kaironv1.ImageReasonResolved, 3, 1)
	for _, m := range warm {
		if slices.Contains(before, m.Name) || m.Labels[kaironv1.LabelMachinePoolTemplateHash] == oldHash {
			t.Errorf("warm member %s was not replaced by the restart", m.Name)
		}
	}
	c := getMachine(t, env, ns, claimedName)
	if c.DeletionTimestamp != nil || c.Spec.Image != ref+"@"+first || c.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateClaimed {
		t.Errorf("claimed member touched by the restart: image %s, labels %v, deleting %v", c.Spec.Image, c.Labels, c.DeletionTimestamp != nil)
	}
	if claim := getClaim(t, env, ns, "job"); claim.Status.Phase != kaironv1.ClaimBound || claim.Status.MachineName != claimedName {
		t.Errorf("claim after the restart: %s", fmtJSON(claim.Status))
	}

	// describe shows the pinned digest, and which members run which.
	out := kctl(t, env, "-n", ns, "describe", "machinepool", "agents")
	_, text, _ := strings.Cut(out, "}\n\n")
	for _, want := range []string{
		"Image:            " + ref + "\n",
		"Pinned digest:    " + moved + "\n",
		"Resolved:         " + time.Now().UTC().Format("2006-"),
		" ago), for template " + templateHash(&p.Spec.Template) + "\n",
		"New members run:  " + ref + "@" + moved + "\n",
		"  " + ref + "@" + first + "   0 warm, 1 claimed\n",
		"  " + ref + "@" + moved + "   3 warm, 0 claimed\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("describe machinepool does not say %q:\n%s", want, text)
		}
	}
}

// A reference pinned by digest is used as it is: no registry is asked
// (none listens at its address). A built-in image pins nothing. A
// snapshot pool's template Machine runs the pinned image too.
func TestPoolImagePinnedByDigestNeedsNoRegistry(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	createNode(t, env, ns, "n1", 16, "16Gi")
	startControllers(t, env, ns, Options{})
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	// Port 9 (discard) of loopback: nothing answers there.
	for _, ref := range []string{"127.0.0.1:9/team/app@" + digest, "127.0.0.1:9/team/app:1@" + digest} {
		pool := "p" + fmt.Sprint(len(ref))
		createImagePool(t, env, ns, pool, ref, 2)
		waitPoolImage(t, env, ns, pool, ref, digest, kaironv1.ImageReasonPinnedByDigest, 2, 0)
		if at := getPool(t, env, ns, pool).Status.Image.ResolvedAt; at != nil {
			t.Errorf("pool %s: status.image.resolvedAt = %v for a reference no registry was asked about", pool, at)
		}
	}

	createImagePool(t, env, ns, "builtin", "", 1)
	eventually(t, "the built-in pool's member", func() (bool, string) {
		p := getPool(t, env, ns, "builtin")
		return p.Status.Warm == 1 && p.Status.ObservedGeneration == p.Generation, fmtJSON(p.Status)
	})
	p := getPool(t, env, ns, "builtin")
	if p.Status.Image != nil || meta.FindStatusCondition(p.Status.Conditions, kaironv1.ConditionImageResolved.String()) != nil {
		t.Errorf("a built-in image's pool has status.image %s and conditions %s", fmtJSON(p.Status.Image), fmtJSON(p.Status.Conditions))
	}
	if warm, _ := poolMachines(t, env, ns, "builtin"); len(warm) != 1 || warm[0].Spec.Image != kaironv1.DefaultImage {
		t.Errorf("built-in pool's members: %s", membersByImage(warm, nil))
	}

	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	d := pushRandom(t, reg, "team/snap:1")
	ref := reg.Ref("team/snap:1")
	createImagePool(t, env, ns, "snap", ref, 1, func(p *kaironv1.MachinePool) { p.Spec.WarmFrom = kaironv1.WarmFromSnapshot })
	eventually(t, "the snapshot pool's template machine, pinned", func() (bool, string) {
		templates := listMachines(t, env, ns, client.MatchingLabels{kaironv1.LabelMachinePoolTemplate: "snap"})
		return len(templates) == 1 && templates[0].Spec.Image == ref+"@"+d, fmt.Sprint(names(templates), " ", fmtJSON(templates))
	})
	waitPoolImage(t, env, ns, "snap", ref+"@"+d, d, kaironv1.ImageReasonResolved, 1, 0)
}

// A private registry: with the right pull secret the pool resolves and
// pins; without it, or with a tag that is not there, it creates no member
// and says why on its ImageResolved condition and in an event, naming
// the reference; the secret created later is picked up by the retry.
func TestPoolResolvesAPrivateImageWithItsPullSecret(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{Users: map[string]string{"kairon": "s3cret"}})
	d := pushRandom(t, reg, "team/private:1")
	ref := reg.Ref("team/private:1")
	createNode(t, env, ns, "n1", 16, "16Gi")
	startControllers(t, env, ns, Options{})
	pullSecret(t, env, ns, "creds", reg.Addr, "kairon", "s3cret")
	withSecrets := func(names ...string) func(*kaironv1.MachinePool) {
		return func(p *kaironv1.MachinePool) {
			for _, n := range names {
				p.Spec.Template.Spec.ImagePullSecrets = append(p.Spec.Template.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: n})
			}
		}
	}

	createImagePool(t, env, ns, "authed", ref, 2, withSecrets("creds"))
	createImagePool(t, env, ns, "anon", ref, 2, withSecrets("later"))
	createImagePool(t, env, ns, "missing", reg.Addr+"/team/private:2", 1, withSecrets("creds"))
	waitPoolImage(t, env, ns, "authed", ref+"@"+d, d, kaironv1.ImageReasonResolved, 2, 0)

	for _, tc := range []struct{ pool, ref, cause string }{
		{"anon", ref, "unauthorized"},
		{"missing", reg.Addr + "/team/private:2", "not found"},
	} {
		var cond *metav1.Condition
		eventually(t, "pool "+tc.pool+" to say why it has no image", func() (bool, string) {
			p := getPool(t, env, ns, tc.pool)
			cond = meta.FindStatusCondition(p.Status.Conditions, kaironv1.ConditionImageResolved.String())
			return cond != nil && cond.Reason == kaironv1.ImageReasonResolveFailed, fmtJSON(p.Status)
		})
		if cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, "resolving image "+tc.ref+": "+tc.cause) {
			t.Errorf("pool %s: ImageResolved %s, want False naming %s and %q", tc.pool, fmtJSON(cond), tc.ref, tc.cause)
		}
		if warm, claimed := poolMachines(t, env, ns, tc.pool); len(warm)+len(claimed) > 0 {
			t.Errorf("pool %s created members with an image it could not pin: %s", tc.pool, membersByImage(warm, claimed))
		}
		if p := getPool(t, env, ns, tc.pool); p.Status.Image != nil {
			t.Errorf("pool %s: status.image %s with no digest resolved", tc.pool, fmtJSON(p.Status.Image))
		}
		eventually(t, "pool "+tc.pool+"'s event", func() (bool, string) {
			var list eventsv1.EventList
			if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			var saw []string
			for _, e := range list.Items {
				if e.Regarding.Name == tc.pool && e.Regarding.Kind == "MachinePool" && e.Reason == kaironv1.EventReasonFailedResolveImage &&
					e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, tc.ref) && strings.Contains(e.Note, tc.cause) {
					return true, ""
				}
				saw = append(saw, e.Regarding.Name+": "+e.Reason+": "+e.Note)
			}
			return false, strings.Join(saw, "\n")
		})
	}
	if c := meta.FindStatusCondition(getPool(t, env, ns, "anon").Status.Conditions, kaironv1.ConditionImageResolved.String()); !strings.Contains(c.Message, "secrets that do not exist in namespace "+ns+": later") {
		t.Errorf("pool anon's condition does not name its missing pull secret: %s", c.Message)
	}

	// The secret it names, created now, is used at the next attempt.
	pullSecret(t, env, ns, "later", reg.Addr, "kairon", "s3cret")
	waitPoolImage(t, env, ns, "anon", ref+"@"+d, d, kaironv1.ImageReasonResolved, 2, 0)
}
