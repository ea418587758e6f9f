// Command kstatus prints what kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status), the library
// Flux and kpt judge resources with, computes for each object it reads.
//
// It reads a JSON array of objects on standard input and writes a JSON array of results, one
// per object in the same order: {"status": "InProgress|Current|Failed|Terminating|NotFound|Unknown",
// "message": "...", "conditions": [...]} where conditions are the ones kstatus derives. Nothing is
// interpreted here: the answer is kstatus's own.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Status     string             `json:"status"`
	Message    string             `json:"message"`
	Conditions []status.Condition `json:"conditions"`
}

func main() {
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: reading standard input: %v\n", err)
		os.Exit(2)
	}
	// Kubernetes' own decoder, so whole numbers are int64 as in an object read from the API server.
	var objects []map[string]interface{}
	if err := utiljson.Unmarshal(data, &objects); err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: reading a JSON array of objects: %v\n", err)
		os.Exit(2)
	}
	results := make([]result, 0, len(objects))
	for i, obj := range objects {
		res, err := status.Compute(&unstructured.Unstructured{Object: obj})
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: object %d: %v\n", i, err)
			os.Exit(1)
		}
		conditions := res.Conditions
		if conditions == nil {
			conditions = []status.Condition{}
		}
		results = append(results, result{Status: res.Status.String(), Message: res.Message, Conditions: conditions})
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintf(os.Stderr, "kstatus: writing: %v\n", err)
		os.Exit(1)
	}
}
