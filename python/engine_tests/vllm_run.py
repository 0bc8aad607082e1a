"""One vLLM engine run, for the real-engine tests: loads MODEL with --load-format FORMAT,
generates greedily from fixed token ids, and prints the token ids and logprobs as JSON.

    python vllm_run.py MODEL FORMAT [EXTRA_CONFIG_JSON] [TP]
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

PROMPTS = [[1, 5, 9, 77, 300, 12, 4], [2, 2, 40, 41, 42, 43, 44, 45, 46, 47]]


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model, load_format = sys.argv[1], sys.argv[2]
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    tp = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    extra = {"model_loader_extra_config": extra} if extra else {}
    llm = LLM(
        model=model,
        load_format=load_format,
        **extra,
        enforce_eager=True,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=256,
        seed=0,
        tensor_parallel_size=tp,
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params)
    result = []
    for out in outs:
        c = out.outputs[0]
        logprobs = [lp[tok].logprob for tok, lp in zip(c.token_ids, c.logprobs)]
        result.append({"token_ids": list(c.token_ids), "logprobs": logprobs})
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
