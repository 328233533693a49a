// Command celref evaluates DRA device selectors exactly as Kubernetes does, as the oracle of
// dra-gpu's differential CEL test (tests/unit/test_cel_upstream.py).
//
// It reads one JSON case per line on stdin and writes one JSON verdict per line on stdout, in
// order. A case is {"expression": "...", "driver": "...", "device": <resource.k8s.io/v1 Device>};
// "device" may be omitted when only the expression is judged. For each case it reports:
//
//   - what the API server says when a DeviceClass or ResourceClaim with this selector is
//     created (k8s.io/kubernetes pkg/apis/resource/validation: too long, compile error in the
//     "new expressions" environment with the default 1.37 feature gates, or too expensive);
//   - what kube-scheduler says for this device: the allocator's cel.NewCache(...).GetOrCompile
//     followed by DeviceMatches, the device having made the round trip through the API (JSON
//     encoding, which makes every quantity canonical), as the allocator sees it.
//
// Run with -decls to print the function declarations of both environments instead (one JSON
// object per overload), which is how dra_gpu's checker table was drawn up.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apiserver/pkg/cel/environment"
	dracel "k8s.io/dynamic-resource-allocation/cel"
)

// The default feature gates of kube-apiserver and kube-scheduler 1.37: DRAConsumableCapacity
// is beta (on), DRAListTypeAttributes alpha (off).
var features = dracel.Features{EnableConsumableCapacity: true, EnableListTypeAttributes: false}

type input struct {
	Expression string          `json:"expression"`
	Driver     string          `json:"driver"`
	Device     json.RawMessage `json:"device"`
}

type verdict struct {
	// Accepted: the API server stores an object with this selector. Rejected says why not.
	Accepted bool   `json:"accepted"`
	Rejected string `json:"rejected,omitempty"`
	MaxCost  uint64 `json:"maxCost,omitempty"`
	// CompileError: the scheduler's GetOrCompile failed (the claim cannot be allocated).
	CompileError string `json:"compileError,omitempty"`
	// Evaluated: DeviceMatches ran; then Result or Error (with its class) says how it ended.
	Evaluated   bool   `json:"evaluated"`
	Result      bool   `json:"result"`
	Error       string `json:"error,omitempty"`
	ErrorClass  string `json:"errorClass,omitempty"`
	ActualCost  uint64 `json:"actualCost,omitempty"`
	DeviceError string `json:"deviceError,omitempty"`
}

const maxExpressionLength = resourceapi.CELSelectorExpressionMaxLength

func validate(expression string) (bool, string, uint64) {
	// validateCELExpression in k8s.io/kubernetes/pkg/apis/resource/validation.
	if len(expression) > maxExpressionLength {
		return false, fmt.Sprintf("Too long: may not be more than %d bytes", maxExpressionLength), 0
	}
	envType := environment.NewExpressions
	result := dracel.GetCompiler(features).CompileCELExpression(expression, dracel.Options{EnvType: &envType})
	if result.Error != nil {
		return false, result.Error.Error(), 0
	}
	if result.MaxCost > resourceapi.CELSelectorExpressionMaxCost {
		return false, "too complex, exceeds cost limit", result.MaxCost
	}
	return true, "", result.MaxCost
}

// errorClass sorts runtime errors into coarse kinds for reports; tests compare verdicts only.
func errorClass(message string) string {
	for _, c := range []struct{ needle, class string }{
		{"no such key", "no_such_key"},
		{"no such overload", "no_such_overload"},
		{"no matching overload", "no_such_overload"},
		{"actual cost limit exceeded", "cost_limit"},
		{"operation cancelled", "cost_limit"},
		{"division by zero", "division_by_zero"},
		{"modulus by zero", "division_by_zero"},
		{"overflow", "overflow"},
		{"index out of range", "index_out_of_range"},
		{"attribute ", "device"},
		{"could not be converted to bool", "not_bool"},
	} {
		if strings.Contains(message, c.needle) {
			return c.class
		}
	}
	return "other"
}

func judge(cache *dracel.Cache, in input) verdict {
	var out verdict
	out.Accepted, out.Rejected, out.MaxCost = validate(in.Expression)
	compiled := cache.GetOrCompile(in.Expression)
	if compiled.Error != nil {
		out.CompileError = compiled.Error.Error()
		return out
	}
	if len(in.Device) == 0 {
		return out
	}
	var device resourceapi.Device
	if err := json.Unmarshal(in.Device, &device); err != nil {
		out.DeviceError = err.Error()
		return out
	}
	// The API round trip: what the scheduler reads back is the encoded object.
	encoded, err := json.Marshal(&device)
	if err == nil {
		device = resourceapi.Device{}
		err = json.Unmarshal(encoded, &device)
	}
	if err != nil {
		out.DeviceError = err.Error()
		return out
	}
	out.Evaluated = true
	matches, details, err := compiled.DeviceMatches(context.Background(), dracel.Device{
		Driver:                   in.Driver,
		AllowMultipleAllocations: device.AllowMultipleAllocations,
		Attributes:               device.Attributes,
		Capacity:                 device.Capacity,
	})
	if details != nil && details.ActualCost() != nil {
		out.ActualCost = *details.ActualCost()
	}
	if err != nil {
		out.Error = err.Error()
		out.ErrorClass = errorClass(out.Error)
		return out
	}
	out.Result = matches
	return out
}

type overload struct {
	Env      string   `json:"env"`
	Function string   `json:"function"`
	ID       string   `json:"id"`
	Member   bool     `json:"member"`
	Args     []string `json:"args"`
	Result   string   `json:"result"`
	Params   []string `json:"params,omitempty"`
}

func dumpDecls() error {
	out := json.NewEncoder(os.Stdout)
	for _, e := range []struct {
		name    string
		envType environment.Type
	}{{"new", environment.NewExpressions}, {"stored", environment.StoredExpressions}} {
		// A compile through the public API gives the environment the allocator uses.
		result := dracel.GetCompiler(features).CompileCELExpression("true", dracel.Options{EnvType: &e.envType})
		if result.Error != nil {
			return result.Error
		}
		env := result.Environment
		functions := env.Functions()
		names := make([]string, 0, len(functions))
		for name := range functions {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			for _, o := range functions[name].OverloadDecls() {
				args := make([]string, 0, len(o.ArgTypes()))
				for _, a := range o.ArgTypes() {
					args = append(args, a.String())
				}
				if err := out.Encode(overload{e.name, name, o.ID(), o.IsMemberFunction(), args, o.ResultType().String(), o.TypeParams()}); err != nil {
					return err
				}
			}
		}
		for _, m := range env.Macros() {
			fmt.Fprintf(os.Stdout, "{\"env\":%q,\"macro\":%q,\"args\":%d,\"receiver\":%t}\n", e.name, m.Function(), m.ArgCount(), m.IsReceiverStyle())
		}
		for _, v := range env.Variables() {
			fmt.Fprintf(os.Stdout, "{\"env\":%q,\"variable\":%q,\"type\":%q}\n", e.name, v.Name(), v.Type().String())
		}
	}
	return nil
}

func main() {
	decls := flag.Bool("decls", false, "print the function declarations of the environments and exit")
	flag.Parse()
	if *decls {
		if err := dumpDecls(); err != nil {
			fmt.Fprintln(os.Stderr, "celref:", err)
			os.Exit(1)
		}
		return
	}
	cache := dracel.NewCache(1024, features)
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 16<<20)
	writer := bufio.NewWriter(os.Stdout)
	encoder := json.NewEncoder(writer)
	encoder.SetEscapeHTML(false)
	for scanner.Scan() {
		var in input
		var out verdict
		if err := json.Unmarshal(scanner.Bytes(), &in); err != nil {
			out.DeviceError = "bad case: " + err.Error()
		} else {
			out = judge(cache, in)
		}
		if err := encoder.Encode(out); err != nil {
			fmt.Fprintln(os.Stderr, "celref:", err)
			os.Exit(1)
		}
		// One verdict per case, as it comes: the caller may wait for each answer.
		if err := writer.Flush(); err != nil {
			fmt.Fprintln(os.Stderr, "celref:", err)
			os.Exit(1)
		}
	}
	if err := scanner.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "celref:", err)
		os.Exit(1)
	}
}
