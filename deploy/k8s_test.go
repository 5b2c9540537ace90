package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// manifest is one document of a file in k8s/, as JSON.
type manifest struct {
	file       string
	apiVersion string
	kind       string
	name       string
	json       []byte
}

func (m manifest) String() string { return fmt.Sprintf("%s: %s %s", m.file, m.kind, m.name) }

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// readManifests splits every k8s/*.yaml into documents and converts each to
// JSON, refusing duplicate keys (as the API server does).
func readManifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("k8s", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in k8s/ (%v)", err)
	}
	var out []manifest
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range docSeparator.Split(string(data), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			j, err := yaml.YAMLToJSONStrict([]byte(doc))
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i+1, err)
			}
			var head struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
				Metadata   struct {
					Name string `json:"name"`
				} `json:"metadata"`
			}
			if err := kjson.UnmarshalCaseSensitivePreserveInts(j, &head); err != nil {
				t.Fatalf("%s document %d: %v", f, i+1, err)
			}
			out = append(out, manifest{file: f, apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name, json: j})
		}
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// decodeStrict decodes JSON into a typed object the way the API server's
// strict field validation does (sigs.k8s.io/json, which Kubernetes itself
// uses): field names are case-sensitive, and an unknown or duplicate field
// is an error.
func decodeStrict(data []byte, into any) error {
	strict, err := kjson.UnmarshalStrict(data, into, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		return fmt.Errorf("strict decoding: %s", strings.Join(msgs, "; "))
	}
	return nil
}

// typedObject returns the k8s.io/api type of an apiVersion and kind.
func typedObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, true
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, true
	case "v1 Service":
		return &corev1.Service{}, true
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, true
	}
	return nil, false
}

// cluster is every decoded manifest, by kind and name.
type cluster struct {
	deployments map[string]*appsv1.Deployment
	statefuls   map[string]*appsv1.StatefulSet
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	scaled      []manifest // keda.sh ScaledObjects, checked in keda_test.go
}

func decodeCluster(t *testing.T) cluster {
	t.Helper()
	c := cluster{
		deployments: map[string]*appsv1.Deployment{},
		statefuls:   map[string]*appsv1.StatefulSet{},
		services:    map[string]*corev1.Service{},
		configMaps:  map[string]*corev1.ConfigMap{},
	}
	for _, m := range readManifests(t) {
		if m.apiVersion == "keda.sh/v1alpha1" && m.kind == "ScaledObject" {
			c.scaled = append(c.scaled, m)
			continue
		}
		obj, ok := typedObject(m.apiVersion, m.kind)
		if !ok {
			t.Errorf("%s: no strict check for %s %s: add its type to typedObject", m, m.apiVersion, m.kind)
			continue
		}
		if err := decodeStrict(m.json, obj); err != nil {
			t.Errorf("%s: %v", m, err)
			continue
		}
		if m.name == "" {
			t.Errorf("%s: no metadata.name", m)
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			c.deployments[m.name] = o
		case *appsv1.StatefulSet:
			c.statefuls[m.name] = o
		case *corev1.Service:
			c.services[m.name] = o
		case *corev1.ConfigMap:
			c.configMaps[m.name] = o
		}
	}
	return c
}

// TestStrictDecodeRefusesUnknownFields shows that the decoding above would
// catch a misspelt or misplaced field.
func TestStrictDecodeRefusesUnknownFields(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field": `{"apiVersion":"apps/v1","kind":"Deployment","spec":{"terminationGracePeriodSeconds":45}}`,
		"wrong case":    `{"apiVersion":"apps/v1","kind":"Deployment","spec":{"Replicas":3}}`,
		"duplicate":     `{"apiVersion":"apps/v1","kind":"Deployment","spec":{"replicas":3,"replicas":4}}`,
	} {
		t.Run(name, func(t *testing.T) {
			if err := decodeStrict([]byte(doc), &appsv1.Deployment{}); err == nil {
				t.Errorf("accepted %s", doc)
			}
		})
	}
	if err := decodeStrict([]byte(`{"spec":{"replicas":3,"template":{"spec":{"terminationGracePeriodSeconds":45}}}}`), &appsv1.Deployment{}); err != nil {
		t.Errorf("refused a valid Deployment: %v", err)
	}
}

func TestKubernetesManifests(t *testing.T) {
	help := gridWorkerHelp(t)
	c := decodeCluster(t)
	if t.Failed() {
		return
	}

	for _, want := range []string{"grid-worker", "caddy-grid"} {
		if c.deployments[want] == nil {
			t.Errorf("no Deployment %s in k8s/", want)
		}
	}
	if c.deployments["redis"] == nil && c.statefuls["redis"] == nil {
		t.Error("no Redis Deployment or StatefulSet named redis in k8s/")
	}
	for _, want := range []string{"redis", "caddy-grid"} {
		if c.services[want] == nil {
			t.Errorf("no Service %s in k8s/", want)
		}
	}
	if len(c.scaled) == 0 {
		t.Error("no KEDA ScaledObject in k8s/")
	}

	// Every workload's selector picks its own pods.
	pods := map[string]*corev1.PodTemplateSpec{}
	for n, d := range c.deployments {
		checkSelector(t, "Deployment "+n, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
		pods["Deployment "+n] = &d.Spec.Template
	}
	for n, s := range c.statefuls {
		checkSelector(t, "StatefulSet "+n, s.Spec.Selector.MatchLabels, s.Spec.Template.Labels)
		pods["StatefulSet "+n] = &s.Spec.Template
	}

	// Every Service selects a workload's pods and targets a port they name.
	for n, s := range c.services {
		matched := false
		for _, p := range pods {
			if labelsMatch(s.Spec.Selector, p.Labels) {
				matched = true
				for _, port := range s.Spec.Ports {
					if !podHasPort(p, port.TargetPort) {
						t.Errorf("Service %s: port %s targets %s, which its pods do not declare", n, port.Name, port.TargetPort.String())
					}
				}
			}
		}
		if !matched {
			t.Errorf("Service %s: selector %v matches no pods in k8s/", n, s.Spec.Selector)
		}
	}

	// Every ConfigMap a pod mounts exists, and every Caddyfile it carries
	// adapts with this repository's Caddy.
	for where, p := range pods {
		for _, v := range p.Spec.Volumes {
			if v.ConfigMap != nil && c.configMaps[v.ConfigMap.Name] == nil {
				t.Errorf("%s mounts ConfigMap %s, which is not in k8s/", where, v.ConfigMap.Name)
			}
		}
	}
	caddyfiles := 0
	for n, cm := range c.configMaps {
		for key, text := range cm.Data {
			if key == "Caddyfile" || strings.HasSuffix(key, ".Caddyfile") {
				caddyfiles++
				adaptCaddyfile(t, "ConfigMap "+n+" key "+key, text)
			}
		}
	}
	if caddyfiles == 0 {
		t.Error("no ConfigMap in k8s/ carries a Caddyfile")
	}

	// The worker: grid-worker's own variables, and a grace period that
	// covers its drain.
	if w := c.deployments["grid-worker"]; w != nil {
		checkWorkerPod(t, help, "Deployment grid-worker", &w.Spec.Template.Spec)
	}
}

// checkWorkerPod checks the container that runs grid-worker: its variables
// and flags exist, and the pod waits longer than the drain before SIGKILL.
func checkWorkerPod(t *testing.T, help workerHelp, where string, spec *corev1.PodSpec) {
	t.Helper()
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want the one grid-worker", where, len(spec.Containers))
	}
	ctr := spec.Containers[0]
	env := map[string]string{}
	var names, own []string
	for _, e := range ctr.Env {
		names = append(names, e.Name)
		env[e.Name] = e.Value
		// A variable only used to build another ($(POD_IP)) is the file's own.
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && referenced(ctr.Env, e.Name) {
			own = append(own, e.Name)
		}
	}
	help.checkEnv(t, where, names, own...)
	for _, a := range append(append([]string{}, ctr.Command...), ctr.Args...) {
		if f, ok := strings.CutPrefix(a, "-"); ok {
			f, _, _ = strings.Cut(strings.TrimPrefix(f, "-"), "=")
			if !help.flags[f] {
				t.Errorf("%s: flag %s is not a grid-worker flag", where, a)
			}
		}
	}
	if spec.TerminationGracePeriodSeconds == nil {
		t.Errorf("%s: no terminationGracePeriodSeconds (Kubernetes' default 30s is not above the default drain timeout)", where)
	} else {
		help.checkStopGrace(t, where, "terminationGracePeriodSeconds", time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second, env, append(append([]string{}, ctr.Command...), ctr.Args...))
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("%s: the pod does not require a non-root user (securityContext.runAsNonRoot)", where)
	}
}

// referenced reports whether another variable's value uses $(name).
func referenced(env []corev1.EnvVar, name string) bool {
	for _, e := range env {
		if e.Name != name && strings.Contains(e.Value, "$("+name+")") {
			return true
		}
	}
	return false
}

func checkSelector(t *testing.T, where string, selector, labels map[string]string) {
	t.Helper()
	if len(selector) == 0 || !labelsMatch(selector, labels) {
		t.Errorf("%s: selector %v does not match its pod labels %v", where, selector, labels)
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func podHasPort(p *corev1.PodTemplateSpec, target intstr.IntOrString) bool {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if (target.Type == intstr.String && cp.Name == target.StrVal) ||
				(target.Type == intstr.Int && cp.ContainerPort == target.IntVal) {
				return true
			}
		}
	}
	return false
}

// sortedKeys is for stable messages.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
