#pragma once
// PPO (Schulman et al. 2017) for the allocator's base policy (ARCHITECTURE §3, issue 7): a
// categorical actor over kActions and a value critic, two TrainNets of tanh layers; the clipped
// surrogate objective, generalised advantage estimation (GAE), an entropy bonus, Adam with the
// global gradient norm clipped, advantages normalised per batch, and a running observation
// normaliser that is frozen between updates (the actor is exported with it). Single-threaded and
// deterministic: the same seed and the same episodes give the same weights bit for bit.
//
// No simulator here: episodes come from anywhere (the twin through MakeExplorer's controller,
// the tests' toy environments).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator_service/core/controller.h"
#include "allocator_service/core/mlp.h"
#include "allocator_service/core/net.h"
#include "common/rng.h"

namespace hlem::allocator {

struct PpoOptions {
  std::vector<uint32_t> hidden = {64, 64};  // actor and critic alike
  double gamma = 0.9;                       // discount per decision window
  double lambda = 0.95;                     // GAE
  double clip = 0.2;                        // the surrogate's ratio clip
  double lr = 3e-4;                         // Adam, actor and critic
  double entropy = 0.01;                    // entropy bonus coefficient
  double value_coef = 0.5;                  // critic loss weight
  double max_grad_norm = 0.5;               // per network
  int epochs = 8;                           // passes over each batch
  uint32_t minibatch = 256;
  double obs_clip = 5;  // normalised observations are clamped to ±obs_clip
  uint64_t seed = 1;    // initial weights and minibatch shuffles
  // A one-line record of these options (for the weights file).
  std::string Describe() const;
};

// One decision as collected.
struct PpoStep {
  std::vector<double> raw;  // the observation as the environment gave it
  std::vector<double> obs;  // normalised with the statistics in force when it was collected
  int action = 0;
  double logp = 0;      // log π(action | obs) at collection
  double value = 0;     // V(obs) at collection
  double reward = 0;    // what followed the action
  uint64_t window = 0;  // the explorer's: index of the window whose Reward() this is
};

// A run of decisions of one actor (one node); `bootstrap` is V of the state after the last step
// when the run was cut off (0 for a true end).
struct PpoEpisode {
  std::vector<PpoStep> steps;
  double bootstrap = 0;
};

struct PpoUpdateStats {
  size_t steps = 0;
  double mean_reward = 0;
  double policy_loss = 0, value_loss = 0, entropy = 0;
  double approx_kl = 0;      // mean (logp_old − logp_new) over the last epoch
  double clip_fraction = 0;  // of the last epoch's samples
  double explained_var = 0;  // of the returns by the values at collection
};

class PpoAgent {
 public:
  // INVALID_ARGUMENT for sizes or options out of range (each named).
  static absl::StatusOr<std::unique_ptr<PpoAgent>> Create(uint32_t inputs, uint32_t actions,
                                                          const PpoOptions& options);

  uint32_t inputs() const { return actor_.inputs(); }
  uint32_t actions() const { return actor_.outputs(); }
  size_t parameters() const { return actor_.size() + critic_.size(); }
  const PpoOptions& options() const { return o_; }

  // The observation normalised with the frozen statistics.
  std::vector<double> Normalise(std::span<const double> raw) const;
  struct Choice {
    int action = 0;
    double logp = 0, value = 0;
  };
  // An action drawn from π(· | obs) (obs normalised), with its log-probability and V(obs).
  Choice Sample(std::span<const double> obs, Rng& rng) const;
  // π(· | obs) as probabilities, V(obs).
  std::vector<double> Probabilities(std::span<const double> obs) const;
  double Value(std::span<const double> obs) const;

  // One PPO update on the episodes (GAE, then `epochs` passes of shuffled minibatches), then the
  // observation statistics absorb the episodes' raw observations. Empty episodes are skipped;
  // INVALID_ARGUMENT when there is no step at all or a step does not fit the agent.
  absl::StatusOr<PpoUpdateStats> Update(const std::vector<PpoEpisode>& episodes);

  // The actor as the allocator runs it (greedy over the scores), with the frozen normaliser.
  absl::StatusOr<Mlp> ExportActor() const;

 private:
  PpoAgent(uint32_t inputs, uint32_t actions, const PpoOptions& options, Rng& init);
  Normaliser CurrentNormaliser() const;

  const PpoOptions o_;
  Rng rng_;  // minibatch shuffles
  TrainNet actor_, critic_;
  Adam actor_adam_, critic_adam_;
  // Running mean and variance of the raw observations (Chan et al.'s parallel update).
  double count_ = 0;
  std::vector<double> mean_, m2_;
  std::vector<double> frozen_mean_, frozen_std_;
};

// The controller that collects PPO episodes in a control loop: each closed window it rewards the
// previous decision with the window's Reward(), samples an action for the window's features from
// the agent and applies it as MakePolicy does (α + Δα, clipped to the bounds). `out` collects the
// steps; after the run, `out->bootstrap` is V of the last window's state (its step has no
// reward yet and is not kept). The agent must outlive the controller and not be updated while it
// runs. INVALID_ARGUMENT unless the agent takes kNumFeatures inputs and kActions.size() actions.
absl::StatusOr<std::unique_ptr<Controller>> MakeExplorer(const PpoAgent& agent, uint64_t seed,
                                                         PpoEpisode* out,
                                                         const Bounds& bounds = {});

}  // namespace hlem::allocator
