"""The localisation report (studies/localisation) on made-up run results."""
from studies.localisation import report


def fake(seed, pointing, energy):
  return {"seed": seed, "pre_temperature": {"accuracy": 0.4, "ece": 0.1},
          "context": {"average_confidence": 0.2},
          "localisation": {"pointing_game": pointing, "energy_in_box": energy,
                           "grad_cam_pp": {"pointing_game": pointing, "energy_in_box": energy}}}


def test_table_gives_mean_and_sample_std_over_seeds():
  runs = {"ce": [fake(0, 0.5, 0.3), fake(1, 0.7, 0.5)]}
  row = report.table(runs).splitlines()[2]
  assert row.startswith("| CE | 2 | 0.400 ± 0.000 | 0.100 ± 0.000 | 0.600 ± 0.141 | 0.400 ± 0.141")


def test_claims_pair_seeds_and_count_where_als_wins():
  runs = {"ce": [fake(0, 0.5, 0.3), fake(1, 0.7, 0.5)],
          "als": [fake(1, 0.6, 0.6), fake(0, 0.6, 0.2)]}
  lines = report.claims(runs).splitlines()
  assert lines[2] == "| ALS > CE, pointing game (Grad-CAM) | -0.100, +0.100 | 1/2 seeds |"
  assert lines[3] == "| ALS > CE, energy in box (Grad-CAM) | +0.100, -0.100 | 1/2 seeds |"
  assert len(lines) == 4  # no ALS + context runs: no rows for it
