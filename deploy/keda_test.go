package deploy

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// KEDA's ScaledObject is checked against KEDA's own published schema, not
// against its Go types: github.com/kedacore/keda/v2/apis/keda/v1alpha1
// brings in controller-runtime and all of client-go (about 620 packages),
// which would multiply this module's cold build. The KEDA module is fetched
// through the Go module proxy at this version (3 MB, kept in the module
// cache), and two of its files are read:
//
//   - config/crd/bases/keda.sh_scaledobjects.yaml, the CRD's OpenAPI v3
//     schema, which the API server validates a ScaledObject against. Every
//     object in it that lists its properties is closed here (unknown fields
//     fail, as with kubectl's default strict field validation); metadata is
//     decoded strictly into metav1.ObjectMeta.
//   - pkg/scalers/prometheus_scaler.go: the names of the Prometheus
//     trigger's metadata, from its `keda:"name=..."` struct tags. The CRD
//     types trigger metadata as a free map, so this is what catches a
//     misspelt key.
const kedaModule = "github.com/kedacore/keda/v2@v2.21.0"

// kedaDir downloads the KEDA module (or finds it in the module cache).
func kedaDir(t *testing.T) string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(goBin, "mod", "download", "-json", kedaModule)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("downloading %s for its ScaledObject schema: %v\n%s%s", kedaModule, err, out, stderr.String())
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", kedaModule, err, info.Error)
	}
	return info.Dir
}

// scaledObjectSchema compiles the v1alpha1 schema of KEDA's CRD, closed.
func scaledObjectSchema(t *testing.T, dir string) *jsonschema.Schema {
	t.Helper()
	crdFile := filepath.Join(dir, "config", "crd", "bases", "keda.sh_scaledobjects.yaml")
	data, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatalf("%s: %v", crdFile, err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(j, &crd); err != nil {
		t.Fatalf("%s: %v", crdFile, err)
	}
	for _, v := range crd.Spec.Versions {
		if v.Name != "v1alpha1" {
			continue
		}
		schema := v.Schema.OpenAPIV3Schema
		closeObjects(schema)
		c := jsonschema.NewCompiler()
		if err := c.AddResource("keda-scaledobject.json", schema); err != nil {
			t.Fatal(err)
		}
		s, err := c.Compile("keda-scaledobject.json")
		if err != nil {
			t.Fatalf("compiling KEDA's ScaledObject schema: %v", err)
		}
		return s
	}
	t.Fatalf("%s has no v1alpha1 schema", crdFile)
	return nil
}

// closeObjects makes every object schema that lists its properties refuse
// others, unless it says how to treat them (additionalProperties, or
// x-kubernetes-preserve-unknown-fields).
func closeObjects(s any) {
	switch v := s.(type) {
	case map[string]any:
		if _, ok := v["properties"]; ok {
			_, ap := v["additionalProperties"]
			_, keep := v["x-kubernetes-preserve-unknown-fields"]
			if !ap && !keep {
				v["additionalProperties"] = false
			}
		}
		for _, child := range v {
			closeObjects(child)
		}
	case []any:
		for _, child := range v {
			closeObjects(child)
		}
	}
}

// prometheusTriggerKeys lists the metadata names KEDA's Prometheus scaler
// reads, and which of them it requires.
func prometheusTriggerKeys(t *testing.T, dir string) (known, required map[string]bool) {
	t.Helper()
	src := filepath.Join(dir, "pkg", "scalers", "prometheus_scaler.go")
	f, err := parser.ParseFile(token.NewFileSet(), src, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	known, required = map[string]bool{}, map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		field, ok := n.(*ast.Field)
		if !ok || field.Tag == nil {
			return true
		}
		raw, err := strconv.Unquote(field.Tag.Value)
		if err != nil {
			return true
		}
		tag := reflect.StructTag(raw).Get("keda")
		if tag == "" {
			return true
		}
		var names []string
		optional := false
		for _, part := range strings.Split(tag, ",") {
			part = strings.TrimSpace(part)
			switch {
			case strings.HasPrefix(part, "name="):
				names = strings.Split(strings.TrimPrefix(part, "name="), ";")
			case part == "optional", strings.HasPrefix(part, "default="):
				optional = true
			case strings.HasPrefix(part, "order=") && !strings.Contains(part, "triggerMetadata"):
				names = nil // read from auth parameters or elsewhere only
			}
		}
		for _, n := range names {
			known[n] = true
			if !optional && len(names) == 1 {
				required[n] = true
			}
		}
		return true
	})
	if len(known) < 5 {
		t.Fatalf("%s: found only %v; has KEDA changed how it declares trigger metadata?", src, known)
	}
	return known, required
}

// gridMetricNames lists the metric names the plugin registers, read from
// its source (../caddygrid), as caddy_<subsystem>_<name>.
func gridMetricNames(t *testing.T) map[string]bool {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join("..", "caddygrid", "*.go"))
	re := regexp.MustCompile(`Namespace:\s*"caddy",\s*Subsystem:\s*"grid",\s*Name:\s*"([a-z0-9_]+)"`)
	names := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(data), -1) {
			names["caddy_grid_"+m[1]] = true
		}
	}
	if !names["caddy_grid_queue_depth"] {
		t.Fatalf("no caddy_grid_queue_depth among the metrics found in ../caddygrid: %v", names)
	}
	return names
}

type scaledObject struct {
	Metadata v1.ObjectMeta `json:"metadata"`
	Spec     struct {
		ScaleTargetRef struct {
			Kind string `json:"kind"`
			Name string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount"`
		Triggers        []struct {
			Type     string            `json:"type"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

func TestScaledObject(t *testing.T) {
	c := decodeCluster(t)
	if len(c.scaled) == 0 {
		t.Fatal("no ScaledObject in k8s/")
	}
	dir := kedaDir(t)
	schema := scaledObjectSchema(t, dir)
	known, required := prometheusTriggerKeys(t, dir)
	metricNames := gridMetricNames(t)
	metricRef := regexp.MustCompile(`\bcaddy_grid_[a-z0-9_]+`)
	exactPool := regexp.MustCompile(`\bpool\s*=\s*"[^"]*"`)

	t.Run("schema refuses unknown fields", func(t *testing.T) {
		for _, doc := range []string{
			`{"apiVersion":"keda.sh/v1alpha1","kind":"ScaledObject","spec":{"scaleTargetRef":{"name":"w"},"triggers":[{"type":"cpu","metadata":{}}],"minReplicas":1}}`,
			`{"apiVersion":"keda.sh/v1alpha1","kind":"ScaledObject","spec":{"scaleTargetRef":{"name":"w","nmae":"x"},"triggers":[{"type":"cpu","metadata":{}}]}}`,
		} {
			v, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
			if err != nil {
				t.Fatal(err)
			}
			if err := schema.Validate(v); err == nil {
				t.Errorf("accepted %s", doc)
			}
		}
	})

	for _, m := range c.scaled {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(m.json))
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		if err := schema.Validate(v); err != nil {
			t.Errorf("%s: against KEDA's CRD schema: %v", m, err)
		}
		var so scaledObject
		var raw struct {
			Metadata json.RawMessage `json:"metadata"`
		}
		if err := json.Unmarshal(m.json, &raw); err != nil {
			t.Fatal(err)
		}
		if err := decodeStrict(raw.Metadata, &so.Metadata); err != nil {
			t.Errorf("%s: metadata: %v", m, err)
		}
		if err := json.Unmarshal(m.json, &so); err != nil {
			t.Fatalf("%s: %v", m, err)
		}

		target := c.deployments[so.Spec.ScaleTargetRef.Name]
		if (so.Spec.ScaleTargetRef.Kind != "" && so.Spec.ScaleTargetRef.Kind != "Deployment") || target == nil {
			t.Errorf("%s: scaleTargetRef %+v is not a Deployment in k8s/", m, so.Spec.ScaleTargetRef)
			continue
		}
		capacity := ""
		for _, e := range target.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "MAX_CONCURRENT_SESSIONS" {
				capacity = e.Value
			}
		}

		for i, tr := range so.Spec.Triggers {
			if tr.Type != "prometheus" {
				t.Errorf("%s: trigger %d is %q; only prometheus triggers are checked here", m, i, tr.Type)
				continue
			}
			for k := range tr.Metadata {
				if !known[k] {
					t.Errorf("%s: trigger %d: KEDA's prometheus scaler has no metadata %q (it reads %v)", m, i, k, sortedKeys(known))
				}
			}
			for k := range required {
				if _, ok := tr.Metadata[k]; !ok {
					t.Errorf("%s: trigger %d: KEDA's prometheus scaler requires metadata %q", m, i, k)
				}
			}
			q := tr.Metadata["query"]
			used := metricRef.FindAllString(q, -1)
			for _, name := range used {
				if !metricNames[name] {
					t.Errorf("%s: trigger %d queries %s, which caddygrid does not export", m, i, name)
				}
			}
			// A Playwright worker's sessions and queue are labelled with
			// its version group (pool "chromium@1.65"): a selector of the
			// pool alone would see none of them.
			for _, sel := range exactPool.FindAllString(q, -1) {
				t.Errorf("%s: trigger %d selects %s, which misses the pool's version groups (pool=\"chromium@1.65\"); use pool=~\"<pool>(@.+)?\"", m, i, sel)
			}
			if !contains(used, "caddy_grid_queue_depth") {
				t.Errorf("%s: trigger %d does not scale on caddy_grid_queue_depth: %s", m, i, q)
			}
			// KEDA asks for ceil(query / threshold) replicas: with demand in
			// sessions, the threshold is one worker's capacity.
			if capacity == "" || tr.Metadata["threshold"] != capacity {
				t.Errorf("%s: trigger %d threshold %q is not the worker's capacity (MAX_CONCURRENT_SESSIONS %q)",
					m, i, tr.Metadata["threshold"], capacity)
			}
		}
	}
}
