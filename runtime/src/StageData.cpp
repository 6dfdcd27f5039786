#include "StageData.h"

namespace pipec::rt {

StageData::StageData(const Plan &plan, const std::string &dataFile, std::optional<TokenDtype> dataDtype,
                     uint64_t seed, const std::vector<Chunk> &chunks)
    : plan_(plan), chunks_(chunks) {
  bool needData = false;
  for (const Chunk &ch : chunks) needData |= ch.model->desc().num_data > 0;
  if (needData) {
    source_ = openDataSource(plan, dataFile, dataDtype, seed);
    if (!source_)
      throw Error(plan.planPath + ": runtime.data.fields is empty, so there is no synthetic data; pass --data FILE");
  }
  matchFields();
}

StageData::StageData(const Plan &plan, std::unique_ptr<io::DataSource> source, const std::vector<Chunk> &chunks)
    : plan_(plan), chunks_(chunks), source_(std::move(source)) {
  matchFields();
}

void StageData::matchFields() {
  synthetic_ = dynamic_cast<const io::SyntheticData *>(source_.get());
  const Plan &plan = plan_;
  for (const Chunk &ch : chunks_) {
    const pipec_stage_desc &d = ch.model->desc();
    fieldIndex_.emplace_back();
    for (int i = 0; i < d.num_data; ++i) {
      const int f = source_->fieldIndex(d.data[i].name);
      if (f < 0)
        throw Error(source_->describe() + ": no field named " + d.data[i].name + " (stage " + std::to_string(ch.vs) +
                    " reads it)");
      const io::FieldSpec &fs = source_->fields()[f];
      std::vector<int64_t> want = shapeOf(d.data[i]);
      if (want.empty() || want[0] != plan.microbatchSize)
        throw Error(ch.model->vstage().library + ": data field " + d.data[i].name + " has shape " +
                    io::shapeString(want) + ", whose first dimension should be the micro-batch size " +
                    std::to_string(plan.microbatchSize));
      want.erase(want.begin());
      if (fs.dtype != d.data[i].dtype || fs.shape != want)
        throw Error(source_->describe() + ": field " + fs.name + " is " + io::dtypeName(fs.dtype) +
                    io::shapeString(fs.shape) + " per sample, stage " + std::to_string(ch.vs) + " needs " +
                    io::dtypeName(d.data[i].dtype) + io::shapeString(want));
      fieldIndex_.back().push_back(f);
    }
  }
}

uint64_t StageData::firstSample(int64_t it, int mb) const {
  return (uint64_t)(it * plan_.microbatches + mb) * (uint64_t)plan_.microbatchSize;
}

void StageData::read(int chunk, int64_t it, int mb, char *dst) {
  const StageModel &m = *chunks_[chunk].model;
  const uint64_t first = firstSample(it, mb);
  for (int i = 0; i < m.desc().num_data; ++i)
    source_->read(fieldIndex_[chunk][i], first, plan_.microbatchSize, dst + m.dataLayout().offsets[i]);
}

void StageData::generate(int chunk, int64_t it, int mb, char *dst, Device &device) {
  if (!synthetic_) throw Error(source_->describe() + ": only synthetic data is generated on the device");
  const StageModel &m = *chunks_[chunk].model;
  const uint64_t first = firstSample(it, mb);
  for (int i = 0; i < m.desc().num_data; ++i)
    device.generateSynthetic(synthetic_->valuesOf(fieldIndex_[chunk][i]), first, plan_.microbatchSize,
                             dst + m.dataLayout().offsets[i]);
}

} // namespace pipec::rt
