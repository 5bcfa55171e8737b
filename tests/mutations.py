"""Mutation check: plant known faults in a copy of the package and require the tests to catch each.

    python tests/mutations.py                 # every fault; exit 1 if one survives or a snippet moved
    python tests/mutations.py --only top_p    # the faults whose name contains "top_p"
    python tests/mutations.py --subprocess    # a fresh interpreter per fault (slower, no fork)

Each row of `FAULTS` names a file, a snippet that must occur in it exactly once, its faulty
replacement, and the few test node ids that must fail on it: one of them (pytest stops at the
first failure), or with ``every=True`` each of them, run one by one (a fault every caller shares,
such as a sign error in the one addition, must fail every caller's own test). The package, the tests and
pyproject.toml are copied into a temporary folder once (data/ and probes/ are linked), so the
working tree is never touched. For each fault the copy's file is rewritten, ``pytest -x -q -p
no:cacheprovider`` runs the listed tests, and the original text is put back.

A fault counts as caught only when pytest reports failed tests (exit 1), not a collection error.
CI runs the whole suite on the clean tree first, so a failure here comes from the fault.

Speed: third-party libraries (torch, transformers, TRL...) are imported once in this process,
which then forks one child per fault; the child imports valueprobe afresh from the copy. Compiled
files are checked by source hash, so a restored file is never shadowed by a mutated one's cache.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import importlib
import os
import py_compile
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider"]


@dataclass(frozen=True)
class Fault:
    name: str
    file: str  # relative to the repository root
    snippet: str  # must occur exactly once in the file
    replacement: str
    tests: tuple[str, ...]  # pytest node ids that must fail
    every: bool = False  # each test must fail on its own, not just one of them


S = "tests/test_steer.py::"
A = "tests/test_attribute.py::"
SAMPLING = "tests/test_sampling.py::"
FAULTS: tuple[Fault, ...] = (
    # --- the one addition: every route, engine, export and the axis add through it ---------------
    Fault(
        "the one addition steers the other way",
        "valueprobe/hooks/addition.py",
        "return (alpha * size)[..., None] * direction",
        "return -(alpha * size)[..., None] * direction",
        (
            S + "test_steered_layer_output_is_h_plus_alpha_sigma_v[llama]",  # the hooks route, add
            "tests/test_operators.py::test_operator_output_is_its_closed_form_under_left_padding[ablate-llama]",
            S + "test_generating_routes_add_alpha_sigma_v_by_hand[hooks]",  # the hf engine's generate
            S + "test_generating_routes_add_alpha_sigma_v_by_hand[nnsight]",
            "tests/test_routes.py::test_steered_logits_match_reference[llama-tlens]",
            "tests/test_vllm_request.py::test_resolved_vector_is_alpha_sigma_vhat_at_the_layer",  # the plugin's
            "tests/test_interop.py::test_gguf_is_what_llama_cpp_and_repeng_read",
            "tests/test_probe.py::test_axis_arithmetic_and_indexing",  # ValueAxis.vector
        ),
        every=True,
    ),
    # --- steering: sampling with common random numbers ---------------------------------------------
    Fault(
        "guided checkpoint keeps a rolled-back row's later cells",
        "valueprobe/guided/run.py",
        "unfeed[i] = r.roll_back(policy.k, policy) + len(took) - 1 - j",
        "unfeed[i] = r.roll_back(policy.k, policy)",
        (
            "tests/test_guide.py::test_the_host_looking_once_per_checkpoint_decides_as_it_would_every_step[rollback]",
        ),
    ),
    Fault(
        "guided checkpoint skips a draw",
        "valueprobe/guided/run.py",
        "state = [[index[id(r)], r.seq[r.fed], r.spent] for r in batch.rows]",
        "state = [[index[id(r)], r.seq[r.fed], r.spent + 1] for r in batch.rows]",
        ("tests/test_guide.py::test_candidates_are_the_rows_generate_samples",),
    ),
    Fault(
        "serve penalties count a token twice",
        "valueprobe/steering/decode/rows.py",
        "            self.seen += new\n",
        "            self.seen += new - 1\n",
        ("tests/test_serve.py::test_penalties_counted_on_the_device_equal_vllms_formula_bit_for_bit",),
    ),
    Fault(
        "sampler stream depends on alpha",
        "valueprobe/steering/decode/generation.py",
        "seeds = [int(r.seed or 0) for r in chunk]",
        "seeds = [int(r.seed or 0) + int(1000 * r.alpha) for r in chunk]",
        (S + "test_common_random_numbers_give_one_text_per_prompt_and_sample[llama]",),
    ),
    Fault(
        "sampler ignores top_p",
        "valueprobe/steering/decode/sampling.py",
        "    if top_p < 1:\n",
        "    if False:\n",
        (S + "test_sampler_top_p_keeps_the_smallest_set_reaching_p",),
    ),
    Fault(
        "sampler ignores temperature",
        "valueprobe/steering/decode/sampling.py",
        "scores.to(torch.float64, copy=True).div_(self.temperature)",
        "scores.to(torch.float64, copy=True)",
        (S + "test_sampler_temperature_divides_the_logits",),
    ),
    Fault(
        "generate drops top_p",
        "valueprobe/steering/decode/generation.py",
        "RowSampler(seeds, temperature=run.decoding.temperature, top_p=run.decoding.top_p)",
        "RowSampler(seeds, temperature=run.decoding.temperature)",
        (S + "test_generate_passes_temperature_and_top_p_to_the_sampler",),
    ),
    Fault(
        "generate drops temperature",
        "valueprobe/steering/decode/generation.py",
        "RowSampler(seeds, temperature=run.decoding.temperature, top_p=run.decoding.top_p)",
        "RowSampler(seeds, top_p=run.decoding.top_p)",
        (S + "test_generate_passes_temperature_and_top_p_to_the_sampler",),
    ),
    Fault(
        "top_p drops the token that crosses p",
        "valueprobe/steering/decode/sampling.py",
        "keep = (cdf - ranked) < top_p  # the first token is always kept",
        "keep = cdf < top_p",
        (S + "test_sampler_top_p_keeps_the_smallest_set_reaching_p",),
    ),
    Fault(
        "sampler draws on the untruncated scale",
        "valueprobe/steering/decode/sampling.py",
        "u = uniform * cdf[:, -1]",
        "u = uniform",
        (S + "test_sampler_top_p_keeps_the_smallest_set_reaching_p",),
    ),
    Fault(
        "shortlist trusts a pick tied with its k-th token",
        "valueprobe/steering/decode/sampling.py",
        "above_kth = ranked.gather(1, pick) > ranked[:, -1:]",
        "above_kth = ranked.gather(1, pick) >= ranked[:, -1:]",
        (SAMPLING + "test_ties_straddling_the_shortlist_take_the_lowest_ids",),
    ),
    Fault(
        "shortlist keeps topk's order among ties",
        "valueprobe/steering/decode/sampling.py",
        "by_id, perm = index.sort(dim=-1)",
        "by_id, perm = index, torch.arange(index.shape[1]).expand_as(index)",
        (SAMPLING + "test_ties_inside_the_shortlist_are_ordered_by_id",),
    ),
    Fault(
        "shortlist trusts a top_p cut past its k",
        "valueprobe/steering/decode/sampling.py",
        "known = ~kept[:, -1]",
        "known = kept[:, -1] | True",
        (SAMPLING + "test_top_p_cut_inside_the_shortlist_is_exact_without_the_sort",),
    ),
    Fault(
        "shortlist scales u by the unsorted sum",
        "valueprobe/steering/decode/sampling.py",
        "slack = 4 * probs.shape[1] * 2.0**-53",
        "slack = 0.0",
        (SAMPLING + "test_a_uniform_on_a_cdf_step_is_not_decided_by_an_unsorted_sum",),
    ),
    # --- steering: where and how hard --------------------------------------------------------------
    Fault(
        "generate ignores positions",
        "valueprobe/steering/decode/generation.py",
        "        run.spec,\n",
        "        __import__('dataclasses').replace(run.spec, positions='all'),\n",
        (S + "test_generate_steers_its_positions_and_unit_like_the_handle[prompt-norm]",),
    ),
    Fault(
        "generate records the wrong unit",
        "valueprobe/steering/decode/generation.py",
        "unit=run.spec.unit.value,",
        'unit="sigma",',
        (S + "test_generate_steers_its_positions_and_unit_like_the_handle[prompt-norm]",),
    ),
    Fault(
        "prompt boundary off by one",
        "valueprobe/steering/hook/handle.py",
        "generated = step.columns() - self.prompt_length  # < 0 in the prompt",
        "generated = step.columns() - self.prompt_length - 1",
        (S + "test_kv_cache_logits_equal_full_forward_every_token[prompt-llama]",),
    ),
    Fault(
        "prompt and generated swapped in Steering.cells",
        "valueprobe/steering/hook/handle.py",
        'keep = generated < 0 if where == "prompt" else generated >= 0',
        'keep = generated >= 0 if where == "prompt" else generated < 0',
        (S + "test_kv_cache_logits_equal_full_forward_every_token[prompt-llama]",),
    ),
    Fault(
        "cached forwards see columns from 0 (KV-cache offset lost)",
        "valueprobe/hooks/patch.py",
        "return torch.arange(self.n_new, device=self.pad.device) + self.offset",
        "return torch.arange(self.n_new, device=self.pad.device)",
        (S + "test_kv_cache_logits_equal_full_forward_every_token[generated-llama]",),
    ),
    Fault(
        "a static cache's offset read on the host every step",
        "valueprobe/hooks/patch.py",
        "return length.clone() if isinstance(length, Tensor) else int(length)",
        "return int(length)",
        ("tests/test_sync.py::test_steering_under_a_static_cache_makes_no_sync_per_step[all]",),
    ),
    Fault(
        "a latch carries over into the next sequence",
        "valueprobe/steering/hook/condition.py",
        "latched = self.latched & (step.offset != 0)",
        "latched = self.latched",
        ("tests/test_condition.py::test_a_latch_starts_over_with_each_new_sequence",),
    ),
    Fault(
        "pad cells steered",
        "valueprobe/steering/hook/handle.py",
        "ok = ~step.pad",
        "ok = torch.ones_like(step.pad)",
        (S + "test_steered_layer_output_is_h_plus_alpha_sigma_v[llama]",),
    ),
    Fault(
        "norm unit a factor of 100 off",
        "valueprobe/probe/axis.py",
        "        0.01,\n",
        "        1.0,\n",
        (S + "test_units_and_scaled_axis_add_their_closed_form[1.0-norm]",),
    ),
    Fault(
        "raw unit ignores the axis scale",
        "valueprobe/probe/axis.py",
        "return float(self.scale)",
        "return 1.0",
        (S + "test_units_and_scaled_axis_add_their_closed_form[2.0-raw]",),
    ),
    Fault(
        "sigma and norm units ignore the axis scale",
        "valueprobe/probe/axis.py",
        "return value * fraction * float(self.scale)",
        "return value * fraction",
        (S + "test_units_and_scaled_axis_add_their_closed_form[2.0-sigma]",),
    ),
    Fault(
        "P(yes) reads yes and no swapped",
        "valueprobe/steering/experiment/yes_no.py",
        "py, pn = probs[:, yes].sum(dim=1), probs[:, no].sum(dim=1)",
        "py, pn = probs[:, no].sum(dim=1), probs[:, yes].sum(dim=1)",
        ("tests/test_steer_sweep.py::test_p_yes_matches_steered_logits_by_hand",),
    ),
    Fault(
        "P(yes) ignores the unit",
        "valueprobe/steering/experiment/yes_no.py",
        "    spec = as_spec(spec)\n",
        "    spec = __import__('dataclasses').replace(as_spec(spec), unit='sigma')\n",
        ("tests/test_steer_sweep.py::test_p_yes_matches_steered_logits_by_hand",),
    ),
    Fault(
        "P(yes) ignores the direction",
        "valueprobe/steering/experiment/yes_no.py",
        "    spec = as_spec(spec)\n",
        "    spec = __import__('dataclasses').replace(as_spec(spec), direction=None)\n",
        ("tests/test_steer_sweep.py::test_p_yes_matches_steered_logits_by_hand",),
    ),
    # --- steering sweeps: resume and the metric set ------------------------------------------------
    Fault(
        "resume forgets finished rows and appends them again",
        "valueprobe/steering/experiment/sweep.py",
        "done = {r.key() for r in read_rows(path)}",
        "done = {r.key() for r in read_rows(path) if False}",
        ("tests/test_steer_sweep.py::test_cli_steer_writes_and_resumes",),
    ),
    Fault(
        "summary adds a metric nobody asked for",
        "valueprobe/steering/experiment/sweep.py",
        "metrics=settings.metrics,",
        'metrics=(*settings.metrics, "backtrack"),',
        ("tests/test_steer_sweep.py::test_cli_steer_writes_and_resumes",),
    ),
    # --- records: the record base's JSON (one key per field, said otherwise by class variables) -----
    Fault(
        "record base writes a key the class omits",
        "valueprobe/records.py",
        "if name in self.OMIT and _same(value, self.OMIT[name]):",
        "if False:",
        (
            "tests/test_records.py::test_record_base_derives_the_json_the_class_says",
            "tests/test_records.py::test_committed_probe_metrics_read_back_to_the_same_bytes",
        ),
    ),
    Fault(
        "record base reads a renamed key under the field's name",
        "valueprobe/records.py",
        "kwargs[name] = d[key]",
        "pass",
        ("tests/test_records.py::test_record_round_trips_through_its_json",),
    ),
    # --- files: atomic writes and the writability check -------------------------------------------
    Fault(
        "atomic_write writes the target in place",
        "valueprobe/files.py",
        'tmp = path.with_name(path.name + ".tmp")',
        "tmp = path",
        ("tests/test_report.py::test_write_report_is_atomic",),
    ),
    Fault(
        "write_report opens the page before rendering it",
        "valueprobe/report/page.py",
        "return write_html(render_report(results, title=title), out)",
        'return (out.open("w", encoding="utf-8").write(render_report(results, title=title)), out)[1]',
        ("tests/test_report.py::test_write_report_is_atomic",),
    ),
    Fault(
        "writability checked in the system temp folder",
        "valueprobe/files.py",
        'tempfile.mkstemp(dir=folder, prefix=".valueprobe-check-")',
        'tempfile.mkstemp(prefix=".valueprobe-check-")',
        ("tests/test_cli_faults.py::test_read_only_output_folder",),
    ),
    # --- activations (capture), probe ------------------------------------------------------------------
    Fault(
        "a span takes the token that starts at its end",
        "valueprobe/activations/encode.py",
        "if b > a and lo <= a < hi]",
        "if b > a and lo <= a <= hi]",
        ("tests/test_probe_sweep.py::test_real_store_from_a_tiny_model",),
    ),
    Fault(
        "span mean divides by one token too many",
        "valueprobe/activations/capture.py",
        "weights[i, r, [t + shifts[i] for t in toks]] = 1.0 / len(toks)",
        "weights[i, r, [t + shifts[i] for t in toks]] = 1.0 / (len(toks) + 1)",
        ("tests/test_probe_sweep.py::test_real_store_from_a_tiny_model",),
    ),
    Fault(
        "SpanDiff takes pre minus post",
        "valueprobe/probe/fitters.py",
        "s[1] / c[1] - s[0] / c[0]",
        "s[0] / c[0] - s[1] / c[1]",
        ("tests/test_probe_sweep.py::test_real_store_from_a_tiny_model",),
    ),
    Fault(
        "val averages projections instead of cosines",
        "valueprobe/read/readout.py",
        '"val": float(readouts.cos[rows].mean())',
        '"val": float(readouts.proj[rows].mean())',
        ("tests/test_cli.py::test_capture_fit_score",),
    ),
    # --- tune: DPO, shift and the safety replication ----------------------------------------------
    Fault(
        "DPO trains with the hinge loss",
        "valueprobe/tune/train.py",
        'loss_type: str = "sigmoid"',
        'loss_type: str = "hinge"',
        ("tests/test_tune.py::test_train_changes_weights_and_reloads[dpo]",),
    ),
    Fault(
        "shift is base minus tuned",
        "valueprobe/tune/shift.py",
        "delta = s_tuned - s_base",
        "delta = s_base - s_tuned",
        ("tests/test_shift.py::test_planted_shift_is_recovered_in_sigma_and_beats_the_null",),
    ),
    Fault(
        "shift reads the tuned side from the base model",
        "valueprobe/tune/shift.py",
        "read(tuned, progress=progress)",
        "read(base, progress=progress)",
        ("tests/test_shift.py::test_planted_shift_is_recovered_in_sigma_and_beats_the_null",),
    ),
    Fault(
        "shift in data σ uses the inverse factor",
        "valueprobe/tune/shift.py",
        "to_data_sigma = float(axis.sigma[axis.layers.index(layer)]) / float((h_base @ v).std())",
        "to_data_sigma = float((h_base @ v).std()) / float(axis.sigma[axis.layers.index(layer)])",
        ("tests/test_shift.py::test_data_sigma_shift_and_random_null_match_closed_forms",),
    ),
    Fault(
        "random-direction null not in each direction's own σ",
        "valueprobe/tune/shift.py",
        "return (p_tuned - p_base) / p_base.std(axis=0), to_data_sigma",
        "return (p_tuned - p_base), to_data_sigma",
        ("tests/test_shift.py::test_data_sigma_shift_and_random_null_match_closed_forms",),
    ),
    Fault(
        "safety gap is neutral minus sensitive",
        "valueprobe/replicate/safety.py",
        '"gap": float(sens.mean() - neut.mean())',
        '"gap": float(neut.mean() - sens.mean())',
        ("tests/test_tune_replicate.py::test_safety_end_to_end",),
    ),
    # --- judging steering: prompt baseline, side effects, front, reliability, CAA, tune-steer --------
    Fault(
        "prompt condition drops its system prompt",
        "valueprobe/steering/experiment/prompting.py",
        'return [{"role": "system", "content": self.text}, *[m for m in chat if m.get("role") != "system"]]',
        'return [m for m in chat if m.get("role") != "system"]',
        ("tests/test_prompt_conditions.py::test_condition_rows_are_the_generation_of_the_chat_they_name",),
    ),
    Fault(
        "side effects drop the sweep's window",
        "valueprobe/steering/experiment/side_effects.py",
        "return replace(sweep.spec, direction=v, direction_name=name)",
        "return replace(sweep.spec, direction=v, direction_name=name, window=None)",
        ("tests/test_steer_eval.py::test_side_effects_steer_with_the_sweeps_spec_whole",),
    ),
    Fault(
        "KL measured from the steered distribution (reversed)",
        "valueprobe/steering/experiment/side_effects.py",
        "div = (ref.exp() * (ref - lp)).sum(dim=-1)",
        "div = (lp.exp() * (lp - ref)).sum(dim=-1)",
        ("tests/test_steer_eval.py::test_kl_and_perplexity_equal_a_plain_hook",),
    ),
    Fault(
        "front counts an α at a KL no random direction reaches",
        "valueprobe/steering/experiment/front.py",
        "return p.alpha != 0 and p.kl <= self.max_random_kl and p.effect > envelope(self.random, p.kl)",
        "return p.alpha != 0 and p.effect > envelope(self.random, p.kl)",
        (
            "tests/test_steer_eval.py::test_front_counts_an_alpha_only_beyond_the_random_front_at_a_reached_kl",
        ),
    ),
    Fault(
        "reliability counts unmoved items as against",
        "valueprobe/steering/experiment/reliability.py",
        "return float((s > 0).mean()), float((s < 0).mean())",
        "return float((s > 0).mean()), float((s <= 0).mean())",
        ("tests/test_steer_eval.py::test_reliability_counts_items_against_the_sign_and_the_shift",),
    ),
    Fault(
        "A/B read ignores left padding in position ids",
        "valueprobe/steering/experiment/ab.py",
        "position = (mask.cumsum(-1) - 1).clamp(min=0)",
        "position = torch.arange(mask.shape[1]).expand_as(mask)",
        ("tests/test_caa.py::test_ab_match_equals_a_full_forward_and_batches_equal_singles[gpt2]",),
    ),
    Fault(
        "CAA vector labels the letter A, not the matching answer",
        "valueprobe/replicate/caa.py",
        "label=int(letter == item.matching)",
        'label=int(letter == "A")',
        ("tests/test_caa.py::test_caa_vector_is_the_difference_of_hidden_state_means",),
    ),
    Fault(
        "tune-steer chooses beyond the KL bound",
        "valueprobe/steering/experiment/search.py",
        "within = [c for c in candidates if c.kl <= max_kl and math.isfinite(c.val_effect)]",
        "within = [c for c in candidates if math.isfinite(c.val_effect)]",
        ("tests/test_tune_steer.py::test_choice_is_the_best_validation_move_within_the_bound",),
    ),
    # --- attribute: direct terms, patching, ablation --------------------------------------------------
    Fault(
        "direct attribution drops the output bias",
        "valueprobe/attribute/direct.py",
        "cols.append(bias.expand(z.shape[0], -1))",
        "pass",
        (A + "test_terms_sum_to_the_projection_of_the_residual[last-gpt2]",),
    ),
    Fault(
        "heads split W_O along the wrong axis (the sum still holds)",
        "valueprobe/model/parts.py",
        "return w.reshape(heads, w.shape[0] // heads, w.shape[1]), b",
        "return w.reshape(w.shape[0] // heads, heads, w.shape[1]).transpose(0, 1), b",
        (A + "test_terms_match_transformer_lens_per_head_results_and_decompose_resid[llama]",),
    ),
    Fault(
        "exact patching takes the destination's own activations",
        "valueprobe/attribute/patching.py",
        "_patch_hooks(lm, plan, rows, runs, 1 - dest, f)",
        "_patch_hooks(lm, plan, rows, runs, dest, f)",
        (A + "test_exact_patching_equals_patching_the_whole_sequence[llama]",),
    ),
    Fault(
        "ablation drop ignores a separation below chance",
        "valueprobe/attribute/ablation.py",
        "sign = 1.0 if none >= center else -1.0",
        "sign = 1.0",
        (A + "test_a_set_is_necessary_only_when_its_drop_leaves_the_random_sets",),
    ),
    # --- by kind (issue 29): a reported difference with its sign flipped -------------------------
    Fault(
        "Cohen's d is failure minus success",
        "valueprobe/stats/metrics.py",
        "    diff = pos.mean() - neg.mean()",
        "    diff = neg.mean() - pos.mean()",
        ("tests/test_probe_metrics.py::test_cohens_d_closed_form_and_antisymmetry",),
    ),
    Fault(
        "dose slope reported with its sign flipped",
        "valueprobe/stats/metrics.py",
        "slope = float(_weighted_slopes(x, y, np.ones((1, x.size)))[0])",
        "slope = -float(_weighted_slopes(x, y, np.ones((1, x.size)))[0])",
        ("tests/test_metrics_behaviour.py::test_dose_slope_matches_polyfit_and_resamples_prompts",),
    ),
    # --- by kind: a per-layer quantity given one layer's value at every layer ----------------------
    Fault(
        "unit_size reads the first layer's statistics at every layer",
        "valueprobe/probe/axis.py",
        "value = float(getattr(self, stat)[self.layers.index(layer)])",
        "value = float(getattr(self, stat)[0])",
        (S + "test_several_layers_each_take_their_own_unit_and_statistics[sigma]",),
    ),
    Fault(
        "a per-layer score divides by the best layer's σ at every layer",
        "valueprobe/probe/axis.py",
        "return (self.project(h, layer) - float(self.mu[self._index(layer)])) / self.sigma_at(layer)",
        "return (self.project(h, layer) - float(self.mu[self._index(layer)])) / self.sigma_at(None)",
        ("tests/test_shift.py::test_shift_by_layer_has_the_tuned_models_sign_and_size_at_every_layer",),
    ),
    # --- by kind: two features together (a time checkpoint, then a resume) -------------------------
    Fault(
        "after a time checkpoint the next shard runs a whole block past it",
        "valueprobe/activations/store.py",
        "end = min(todo.stop, (start // block + 1) * block)",
        "end = min(todo.stop, start + block)",
        ("tests/test_store.py::test_time_checkpoints_then_resume_give_the_one_pass_store",),
    ),
    Fault(
        "ablation's rows after a shared prefix restart their positions at 0",
        "valueprobe/attribute/ablation.py",
        "position_ids=position_ids_from_mask(full)[:, -ids.shape[1] :].to(device)",
        "position_ids=position_ids_from_mask(mask).to(device)",
        (A + "test_ablation_reads_with_a_cache_what_whole_forwards_give",),
    ),
    Fault(
        "replicate attribute drops summary.md's hand-written reading",
        "valueprobe/replicate/attribute.py",
        'return "" if at < 0 else text[at + 1 :]',
        'return ""',
        ("tests/test_attribute_run.py::test_replicate_writes_each_job_the_sections_and_the_agreement",),
    ),
    # --- the parts protocol (valueprobe/sharded.py: every kind of part goes through it) -------------
    Fault(
        "a merge joins the parts in the order given, not in shard order",
        "valueprobe/sharded.py",
        "return kind.join(out, sorted(loaded, key=lambda p: p.shard.index))",
        "return kind.join(out, loaded)",
        ("tests/test_parts.py::test_merged_parts_equal_one_process_capture",),
    ),
    Fault(
        "parts run with other settings merge",
        "valueprobe/sharded.py",
        "keys = [k for k in {**first.settings, **p.settings} if k not in skip]",
        "keys = [k for k in {**first.settings, **p.settings} if k in skip]",
        ("tests/test_score_parts.py::test_score_parts_that_do_not_belong_are_refused",),
    ),
    Fault(
        "a part steered on another model merges",
        "valueprobe/sharded.py",
        "if p.model != first.model:",
        "if p.model is None and first.model is not None:",
        ("tests/test_sweep_parts.py::test_sweep_parts_that_do_not_belong_are_refused",),
    ),
    Fault(
        "a merge reads the dataset again without checking its sha256",
        "valueprobe/sharded.py",
        "if path is None or not Path(path).is_file() or sha256_file(path) != sha256:",
        "if path is None or not Path(path).is_file():",
        ("tests/test_shift_parts.py::test_shift_parts_that_do_not_belong_are_refused",),
    ),
)

# Imported once before forking; the children import valueprobe itself from the copy.
HEAVY = (
    "numpy",
    "scipy.stats",
    "sklearn.linear_model",
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.gpt_neox.modeling_gpt_neox",
    "tokenizers",
    "safetensors.torch",
    "plotly.graph_objects",
    "typer",
    "jaxtyping",
    "hypothesis",
    "peft",
    "trl",
    "pytest",
)


def check_snippets(faults: tuple[Fault, ...]) -> list[str]:
    """One line per fault whose snippet does not occur exactly once (or whose file is gone)."""
    problems = []
    for f in faults:
        path = ROOT / f.file
        if not path.is_file():
            problems.append(f"{f.name}: {f.file} does not exist")
            continue
        n = path.read_text(encoding="utf-8").count(f.snippet)
        if n != 1:
            problems.append(f"{f.name}: snippet occurs {n} times in {f.file}: {f.snippet!r}")
    return problems


def make_copy(tmp: Path) -> None:
    """valueprobe/, tests/ and pyproject.toml copied; data/ and probes/ linked (tests read them)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in ("valueprobe", "tests"):
        shutil.copytree(ROOT / name, tmp / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    for name in ("data", "probes"):
        if (ROOT / name).exists():
            (tmp / name).symlink_to(ROOT / name, target_is_directory=True)
    # checked by hash: a source put back after a fault is never shadowed by a cache of the fault
    compileall.compile_dir(
        str(tmp / "valueprobe"), quiet=1, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH
    )


def _child(tmp: Path, tests: tuple[str, ...], log: Path) -> None:
    """In the forked child: output to ``log``, valueprobe from the copy, run pytest, exit with its code."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 3
    try:
        sys.dont_write_bytecode = True
        os.chdir(tmp)
        sys.path.insert(0, str(tmp))
        import pytest

        import valueprobe

        if not Path(valueprobe.__file__).resolve().is_relative_to(tmp.resolve()):
            print(f"valueprobe imported from {valueprobe.__file__}, not the mutated copy", flush=True)
            code = 3
        else:
            code = int(pytest.main([*PYTEST_ARGS, *tests]))
    except BaseException as exc:  # a child must never return into the parent's loop
        print(f"child failed: {exc!r}", flush=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_tests(tmp: Path, tests: tuple[str, ...], log: Path, *, fork: bool) -> int:
    """pytest's exit status on ``tests`` in the copy (1: tests failed)."""
    if not fork:
        env = {**os.environ, "PYTHONPATH": str(tmp), "PYTHONDONTWRITEBYTECODE": "1"}
        with log.open("w") as out:
            return subprocess.run(
                [sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests],
                cwd=tmp,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            ).returncode
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(tmp, tests, log)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def run_every(tmp: Path, tests: tuple[str, ...], log: Path, *, fork: bool) -> int:
    """1 when each of ``tests`` fails on its own; else the first other exit status (0: one passed),
    with that test's log in ``log``."""
    for k, test in enumerate(tests):
        one = log.with_name(f"{log.stem}-{k:02d}.log")
        code = run_tests(tmp, (test,), one, fork=fork)
        if code != 1:
            log.write_text(f"{test}: pytest exit {code}\n" + one.read_text())
            return code
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run only faults whose name contains this text")
    ap.add_argument("--subprocess", action="store_true", help="a fresh interpreter per fault, no fork")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy and logs")
    args = ap.parse_args(argv)
    faults = tuple(f for f in FAULTS if not args.only or args.only in f.name)
    start = time.perf_counter()
    problems = check_snippets(faults)
    if problems:
        print("mutations: snippets not found exactly once (update FAULTS to the new code):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    fork = hasattr(os, "fork") and not args.subprocess
    if fork:
        for mod in HEAVY:
            with contextlib.suppress(ImportError):
                importlib.import_module(mod)
    assert "valueprobe" not in sys.modules, "the parent must not import valueprobe: children read the copy"
    tmp = Path(tempfile.mkdtemp(prefix="valueprobe-mutations-"))
    rows: list[tuple[str, str, float]] = []
    try:
        make_copy(tmp)
        (tmp / "logs").mkdir()
        for i, f in enumerate(faults):
            path = tmp / f.file
            original = path.read_text(encoding="utf-8")
            path.write_text(original.replace(f.snippet, f.replacement), encoding="utf-8")
            t0 = time.perf_counter()
            log = tmp / "logs" / f"{i:02d}.log"
            try:
                code = (
                    run_every(tmp, f.tests, log, fork=fork)
                    if f.every
                    else run_tests(tmp, f.tests, log, fork=fork)
                )
            finally:
                path.write_text(original, encoding="utf-8")
            verdict = {1: "caught", 0: "SURVIVED"}.get(code, f"ERROR (pytest exit {code})")
            rows.append((f.name, verdict, time.perf_counter() - t0))
            print(f"{verdict:>22}  {rows[-1][2]:6.1f} s  {f.name}", flush=True)
            if code != 1:
                print("".join(f"      | {ln}\n" for ln in log.read_text().splitlines()[-15:]), flush=True)
    finally:
        if args.keep:
            print(f"copy and logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    bad = [r for r in rows if r[1] != "caught"]
    width = max(len(r[0]) for r in rows)
    print()
    print(f"{'fault':<{width}}  {'verdict':<22}  seconds")
    for name, verdict, secs in rows:
        print(f"{name:<{width}}  {verdict:<22}  {secs:7.1f}")
    total = time.perf_counter() - start
    print(f"\n{len(rows) - len(bad)}/{len(rows)} faults caught in {total:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
