#include "embedding_shard/transport/ucx_common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <regex>

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace hlem::shard {

std::string LocalHostId() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char buf[64] = {};
    if (std::fgets(buf, sizeof(buf), f) != nullptr) boot_id = buf;
    std::fclose(f);
  }
  while (!boot_id.empty() && (boot_id.back() == '\n' || boot_id.back() == ' ')) boot_id.pop_back();
  return absl::StrCat(host, "/", boot_id);
}

std::string UcsStatusString(ucs_status_t status) { return ucs_status_string(status); }

absl::Status UcsToStatus(ucs_status_t status, absl::string_view what) {
  if (status == UCS_OK) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", UcsStatusString(status));
  switch (status) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
      return absl::ResourceExhaustedError(msg);
    case UCS_ERR_TIMED_OUT:
      return absl::DeadlineExceededError(msg);
    case UCS_ERR_CANCELED:
      return absl::CancelledError(msg);
    case UCS_ERR_INVALID_PARAM:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

namespace {
std::string TlsFor(const std::string& transports) {
  if (transports == "auto") return "";
  if (transports == "shm") return "sm,self";
  if (transports == "tcp") return "tcp,self";
  return transports;
}
}  // namespace

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxOptions& options,
                                                             bool wakeup) {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return UcsToStatus(status, "ucp_config_read");
  std::string tls = TlsFor(options.transports);
  // An explicit UCX_TLS / UCX_NET_DEVICES in the environment wins over the config file.
  if (!tls.empty() && std::getenv("UCX_TLS") == nullptr) {
    status = ucp_config_modify(config, "TLS", tls.c_str());
    if (status != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("ucx.transports '", options.transports, "': ", UcsStatusString(status)));
    }
  }
  if (!options.net_devices.empty() && std::getenv("UCX_NET_DEVICES") == nullptr) {
    status = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str());
    if (status != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("ucx.net_devices '", options.net_devices, "': ", UcsStatusString(status)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | (wakeup ? UCP_FEATURE_WAKEUP : 0);
  params.mt_workers_shared = 0;
  status = ucp_init(&params, config, &w->context_);
  ucp_config_release(config);
  if (status != UCS_OK) return UcsToStatus(status, "ucp_init");

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  status = ucp_worker_create(w->context_, &wparams, &w->worker_);
  if (status != UCS_OK) return UcsToStatus(status, "ucp_worker_create");

  ucp_address_t* address = nullptr;
  size_t length = 0;
  status = ucp_worker_get_address(w->worker_, &address, &length);
  if (status != UCS_OK) return UcsToStatus(status, "ucp_worker_get_address");
  w->address_.assign(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(w->worker_, address);
  return w;
}

UcxWorker::~UcxWorker() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

std::vector<std::string> ParseTransportsFromInfo(const std::string& info) {
  // Lines look like "#   lane[0]:  3:posix/memory.0 md[3] ..." or "#     tcp/lo ..." depending
  // on the printer; match "<tl>/<device>" tokens of known transports.
  static const std::regex kToken(
      R"((?:^|[\s:])(tcp|posix|sysv|cma|knem|xpmem|self|rc_verbs|rc_mlx5|dc_mlx5|ud_verbs|ud_mlx5|rc|ud|dc|cuda_copy|cuda_ipc|gdr_copy)/([A-Za-z0-9_.:-]+))");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(info.begin(), info.end(), kToken);
       it != std::sregex_iterator(); ++it) {
    std::string device = (*it)[2];
    while (!device.empty() && (device.back() == '.' || device.back() == ':')) device.pop_back();
    // "posix/memory.0" -> "posix/memory"
    auto dot = device.find('.');
    if (dot != std::string::npos) device.resize(dot);
    std::string name = absl::StrCat((*it)[1].str(), "/", device);
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

namespace {
template <typename Fn>
std::string PrintToString(Fn&& print) {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buffer, &size);
  if (stream == nullptr) return "";
  print(stream);
  std::fclose(stream);
  std::string text(buffer, size);
  std::free(buffer);
  return text;
}
}  // namespace

std::vector<std::string> UcxWorker::Transports() const {
  return ParseTransportsFromInfo(
      PrintToString([this](FILE* f) { ucp_context_print_info(context_, f); }));
}

std::vector<std::string> EndpointTransports(ucp_ep_h ep) {
  return ParseTransportsFromInfo(PrintToString([ep](FILE* f) { ucp_ep_print_info(ep, f); }));
}

}  // namespace hlem::shard
