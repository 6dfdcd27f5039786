#include "DataSource.h"

#include "NumpyArrays.h"

namespace pipec::rt {

std::unique_ptr<io::DataSource> openDataSource(const Plan &plan, const std::string &dataFile,
                                               std::optional<TokenDtype> dataDtype, uint64_t seed, bool countOnly) {
  if (dataDtype && dataFile.empty())
    throw Error("--data-dtype names the ids of a token file: give the file with --data");
  if (dataDtype)
    return std::make_unique<io::TokenFile>(dataFile, *dataDtype, plan.dataFields, seed);
  if (!dataFile.empty() && isNumpyArrays(dataFile)) {
    std::set<std::string> names;
    for (const io::FieldSpec &field : plan.dataFields)
      names.insert(field.name);
    return openNumpyArrays(dataFile, names, countOnly);
  }
  if (!dataFile.empty())
    return std::make_unique<io::DatasetFile>(dataFile);
  if (!plan.dataFields.empty())
    return std::make_unique<io::SyntheticData>(plan.dataFields, plan.syntheticSamples, seed);
  return nullptr;
}

Validation openValidation(const Plan &plan, const std::string &evalDataFile, int evalEvery, int evalIters,
                          std::optional<TokenDtype> dataDtype, uint64_t seed, bool countOnly) {
  Validation v;
  if (evalDataFile.empty()) {
    if (evalEvery || evalIters) throw Error("--eval-every and --eval-iters validate on held-out data: give --eval-data");
    return v;
  }
  v.source = openDataSource(plan, evalDataFile, dataDtype, seed, countOnly);
  const uint64_t perRound = (uint64_t)plan.microbatches * (uint64_t)plan.microbatchSize;
  v.rounds = evalIters ? evalIters : (int64_t)((v.source->numSamples() + perRound - 1) / perRound);
  return v;
}

} // namespace pipec::rt
